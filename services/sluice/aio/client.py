"""The asyncio ``Client``: the sync :class:`sluice.Client` underneath, its parts awaited.

::

    from sluice.aio import Client

    async with Client("127.0.0.1:7600") as client:
        await client.admin.create_topic("orders", partitions=4)
        async with client.producer("orders") as producer:
            meta = await producer.send(b"v", key=b"k")
        async with client.consumer("g", ["orders"], auto_offset_reset="earliest") as consumer:
            async for record in consumer:
                ...

Same constructor arguments, part names, configuration classes (ProducerConfig, ConsumerConfig,
PushConsumerConfig, with every option they have) and typed errors as the sync SDK: each part
wraps the sync part made by the sync client, so there is one implementation (docs/asyncio.md).
Make it inside a running event loop; its parts belong to that loop.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from sluice.aio.admin import Admin
from sluice.aio.bridge import LoopBridge, Starting
from sluice.aio.consumer import Consumer, bridge_callbacks
from sluice.aio.fetcher import Fetcher
from sluice.aio.producer import Producer
from sluice.aio.push import PushConsumer
from sluice.client.client import Client as SyncClient
from sluice.client.consumer import ConsumerConfig
from sluice.client.fetcher import AutoOffsetReset, TopicPartition
from sluice.client.metadata import ClusterMetadata
from sluice.client.offsets import OffsetSpec
from sluice.client.producer import ProducerConfig
from sluice.client.push import PushConsumerConfig
from sluice.client.push.admin import SubscriptionInfo
from sluice.common.client_security import TLSConfig

__all__ = ["Client"]


class Client:
    """Entry point of the asyncio SDK; the arguments are :class:`sluice.Client`'s. Close it with
    ``await client.close()`` or ``async with``."""

    def __init__(
        self,
        bootstrap: str | None = None,
        client_id: str | None = None,
        request_timeout: float = 30.0,
        *,
        tls: TLSConfig | None = None,
        token: str | Callable[[], str] | None = None,
        token_file: str | Path | None = None,
        username: str | None = None,
        password: str | None = None,
        memory_limit: int = 0,
    ) -> None:
        self._bridge = LoopBridge(asyncio.get_running_loop())
        self._sync = SyncClient(
            bootstrap,
            client_id,
            request_timeout,
            tls=tls,
            token=token,
            token_file=token_file,
            username=username,
            password=password,
            memory_limit=memory_limit,
        )
        self.admin = Admin(self._sync.admin)

    @property
    def sync(self) -> SyncClient:
        """The thread-based client underneath (for code shared with sync callers)."""
        return self._sync

    @property
    def bootstrap(self) -> str:
        return self._sync.bootstrap

    @property
    def client_id(self) -> str:
        return self._sync.client_id

    @property
    def closed(self) -> bool:
        return self._sync.closed

    async def _thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self._bridge.loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))

    # ---- metadata and offsets -------------------------------------------------------------------

    async def metadata(self, topics: Iterable[str] | None = None, refresh: bool = False) -> ClusterMetadata:
        result: ClusterMetadata = await self._thread(self._sync.metadata, topics, refresh)
        return result

    async def list_offsets(
        self, topic: str, spec: OffsetSpec = "earliest", partitions: Iterable[int] | None = None
    ) -> dict[int, int]:
        result: dict[int, int] = await self._thread(self._sync.list_offsets, topic, spec, partitions)
        return result

    async def check_positions(
        self, positions: Mapping[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, int]:
        """The sync :meth:`~sluice.client.client.Client.check_positions` (KIP-320 for readers that keep
        their own positions), awaited."""
        result: dict[TopicPartition, int] = await self._thread(self._sync.check_positions, positions)
        return result

    async def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionInfo]:
        result: list[SubscriptionInfo] = await self._thread(self._sync.list_subscriptions, topic)
        return result

    async def describe_subscription(self, topic: str, subscription: str) -> SubscriptionInfo:
        result: SubscriptionInfo = await self._thread(self._sync.describe_subscription, topic, subscription)
        return result

    # ---- parts ------------------------------------------------------------------------------------

    def producer(
        self, topic: str, *, config: ProducerConfig | None = None, **overrides: Any
    ) -> Starting[Producer]:
        """``await client.producer(topic, ...)`` or ``async with client.producer(...) as p``; the
        arguments are the sync ``producer()``'s."""
        return Starting(self._producer(topic, config, overrides))

    async def _producer(
        self, topic: str, config: ProducerConfig | None, overrides: dict[str, Any]
    ) -> Producer:
        sync = await self._thread(self._sync.producer, topic, config=config, **overrides)
        return Producer(sync, self._bridge)

    def consumer(
        self,
        group: str,
        subscribe: Mapping[str, str] | Iterable[str] | str,
        *,
        config: ConsumerConfig | None = None,
        **overrides: Any,
    ) -> Starting[Consumer]:
        """Join consumer group ``group`` (the sync ``consumer()``'s arguments); the rebalance and
        commit callbacks may be ``async def``. ``await`` it, or ``async with`` it to close it."""
        return Starting(self._consumer(group, subscribe, config, overrides))

    async def _consumer(
        self,
        group: str,
        subscribe: Mapping[str, str] | Iterable[str] | str,
        config: ConsumerConfig | None,
        overrides: dict[str, Any],
    ) -> Consumer:
        cfg = bridge_callbacks(self._sync.consumer_config(config, overrides), self._bridge.loop)
        sync = await self._thread(self._sync.consumer, group, subscribe, config=cfg)
        return Consumer(sync, self._bridge, self._sync.list_offsets)

    def push_consumer(
        self,
        topic: str,
        subscription: str,
        type: str = "exclusive",
        *,
        config: PushConsumerConfig | None = None,
        **overrides: Any,
    ) -> Starting[PushConsumer]:
        """A consumer of push subscription ``subscription`` (the sync ``push_consumer()``'s
        arguments). ``await`` it, or ``async with`` it to close it."""
        return Starting(self._push_consumer(topic, subscription, type, config, overrides))

    async def _push_consumer(
        self,
        topic: str,
        subscription: str,
        type_: str,
        config: PushConsumerConfig | None,
        overrides: dict[str, Any],
    ) -> PushConsumer:
        sync = await self._thread(
            self._sync.push_consumer, topic, subscription, type_, config=config, **overrides
        )
        return PushConsumer(sync, self._bridge)

    def fetcher(
        self,
        positions: Mapping[TopicPartition, int],
        filters: Mapping[str, str] | None = None,
        *,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
        max_bytes: int = 50 * 1024 * 1024,
        partition_max_bytes: int = 1024 * 1024,
        auto_offset_reset: AutoOffsetReset = "none",
        use_sessions: bool = True,
        check_crcs: bool = True,
    ) -> Fetcher:
        """A low-level fetcher reading ``positions`` ({(topic, partition): offset}) without a group; the
        arguments are the sync ``fetcher()``'s (making one sends nothing, so it is not awaited)."""
        sync = self._sync.fetcher(
            positions,
            filters,
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
            max_bytes=max_bytes,
            partition_max_bytes=partition_max_bytes,
            auto_offset_reset=auto_offset_reset,
            use_sessions=use_sessions,
            check_crcs=check_crcs,
        )
        return Fetcher(sync)

    # ---- lifecycle --------------------------------------------------------------------------------

    async def close(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """The sync ``close()`` (every part made here, then the channels), in a worker thread."""
        await self._thread(self._sync.close, timeout)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<aio Client bootstrap={self.bootstrap!r} client_id={self.client_id!r}>"
