"""What the service's helpers need of the service: the subscription book (``registry.py``), the
views (``describe.py``) and the admin (``subadmin.py``) are given a :class:`ServiceHost`, which
``DispatcherService`` is. A protocol, so that they do not import the service that builds them (no
import cycle, not even a type-checking one)."""

from __future__ import annotations

from typing import Protocol

from sluice.common.peers import AioPeers
from sluice.dispatcher.cluster import CoordinatorLink
from sluice.dispatcher.cursor_store import CursorStore
from sluice.dispatcher.feed import PartitionFeed
from sluice.dispatcher.runtime import SubscriptionRuntime
from sluice.security.context import Authorizer

__all__ = ["ServiceHost"]


class ServiceHost(Protocol):
    @property
    def dispatcher_id(self) -> str: ...

    #: The authorization seam (``sluice.security.context``).
    @property
    def authorizer(self) -> Authorizer: ...

    @property
    def channels(self) -> AioPeers: ...

    @property
    def link(self) -> CoordinatorLink: ...

    @property
    def store(self) -> CursorStore: ...

    #: The loaded subscriptions, by (topic, subscription).
    @property
    def runtimes(self) -> dict[tuple[str, str], SubscriptionRuntime]: ...

    #: The running partition feeds, by (topic, partition).
    @property
    def feeds(self) -> dict[tuple[str, int], PartitionFeed]: ...

    def now_ms(self) -> int: ...

    async def list_offsets(self, topic: str, partitions: list[int], timestamp: int) -> dict[int, int]: ...

    async def drop(self, rt: SubscriptionRuntime) -> None: ...
