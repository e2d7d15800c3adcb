"""Parked keys for operators: ``ListParkedKeys`` and ``UnparkKey`` (``sluice subscription parked|unpark``).

Core: authorizes, reads or changes the live state of a loaded subscription (``parking.py``), and
answers domain values (``convert.py`` makes the protobuf). A subscription this dispatcher has not loaded
(right after a restart, before a consumer came back) is listed from its parking store
(``parkread.live_state``: the same state a load restores), for the partitions this dispatcher serves,
with the state ``stored``: its policy and limits come with its first consumer. ``unpark`` of such a
subscription appends the ``unpark`` event to its store, under the admin lock that a load takes too
(``docs/poison-keys.md``).

**Never a partial answer.** A subscription being loaded (its first consumer back after a restart) has
no parked keys in memory until its store's load is done; one being unloaded may still be writing its
store. Both calls wait for that to finish (``_settled``), bounded by the request's deadline, and past it
raise ``ParkStoreLoading`` (retriable) rather than list nothing or answer "not parked".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sluice.common.timeouts import within
from sluice.dispatcher.host import ServiceHost
from sluice.dispatcher.model import ParkEvent
from sluice.dispatcher.parkread import live_state, produce
from sluice.dispatcher.parkstore import event_record
from sluice.dispatcher.registry import wall_ms
from sluice.errors import ParkStoreLoading
from sluice.retry.levels import sub_dlq_topic
from sluice.retry.parkbook import ParkBook, sub_park_topic
from sluice.security.context import Operation, RequestContext
from sluice.security.model import Resource, ResourceType

if TYPE_CHECKING:
    from sluice.dispatcher.runtime import SubscriptionRuntime

__all__ = ["ParkedKeyInfo", "ParkedKeysAdmin"]

log = logging.getLogger(__name__)

#: How long a call waits for a load when the request has no deadline.
DEFAULT_WAIT_S = 30.0
#: Given back from the request's deadline, so the typed error reaches the caller before it gives up.
DEADLINE_MARGIN_S = 0.25


@dataclass(frozen=True, slots=True)
class ParkedKeyInfo:
    key: bytes
    state: str
    since_ms: int
    head_partition: int
    head_offset: int
    head_redelivery_count: int
    waiting: int
    dispatcher_id: str


async def _stored(service: ServiceHost, topic: str, subscription: str) -> tuple[ParkBook, set[int]]:
    """The store's state of a subscription not loaded here, less what a load would find in the DLQ
    already, and the partitions of ``topic`` this dispatcher serves."""
    link = service.link
    book = (
        await live_state(
            link,
            service.channels,
            sub_park_topic(topic, subscription),
            sub_dlq_topic(topic, subscription),
            topic,
        )
    ).book
    # After the reads (they refresh the view): right after a restart the view may still be the empty
    # one the dispatcher starts with (registered, not refreshed yet), which serves no partition.
    mine = set(link.view.partitions_of(topic, service.dispatcher_id))
    if not mine:
        mine = set((await link.refresh()).partitions_of(topic, service.dispatcher_id))
    return book, mine


async def stored_keys(service: ServiceHost, topic: str, subscription: str) -> list[ParkedKeyInfo]:
    """The parked keys in the store of a subscription not loaded here (partitions served here)."""
    book, mine = await _stored(service, topic, subscription)
    by_key: dict[bytes, list[tuple[int, int, int, int, int]]] = {}
    for ((t, p), key), bk in book.keys.items():
        if t == topic and p in mine and bk.pending:
            head = bk.pending[0].offset
            by_key.setdefault(key, []).append((p, head, bk.count, bk.since_ms, len(bk.pending)))
    out = []
    for key, parts in by_key.items():
        p, o, *_ = min(parts)
        out.append(
            ParkedKeyInfo(
                key=key,
                state="stored",
                since_ms=min(s for _, _, _, s, _ in parts),
                head_partition=p,
                head_offset=o,
                head_redelivery_count=max(c for _, _, c, _, _ in parts),
                waiting=sum(n for *_, n in parts) - 1,
                dispatcher_id=service.dispatcher_id,
            )
        )
    return sorted(out, key=lambda k: k.since_ms)


class ParkedKeysAdmin:
    def __init__(
        self, service: ServiceHost, locked: Callable[[str, str], AbstractAsyncContextManager[None]]
    ) -> None:
        self._service = service
        #: The subscription's admin lock (``SubscriptionAdmin.locked``), which a Subscribe holds while it
        #: loads: held, no load can begin.
        self._locked = locked

    @staticmethod
    def _deadline(wait_s: float | None) -> float:
        """The loop time by which a call answers: the request's time left (``wait_s``; None: no
        deadline, then ``DEFAULT_WAIT_S``) less ``DEADLINE_MARGIN_S``."""
        wait = DEFAULT_WAIT_S if wait_s is None else max(wait_s - DEADLINE_MARGIN_S, 0.0)
        return asyncio.get_running_loop().time() + wait

    def _loading(self, topic: str, subscription: str, what: str) -> ParkStoreLoading:
        return ParkStoreLoading(
            f"subscription {subscription!r} of topic {topic!r} is {what} its parking store on dispatcher "
            f"{self._service.dispatcher_id}: ask again shortly"
        )

    async def _settled(self, topic: str, subscription: str, deadline: float) -> SubscriptionRuntime | None:
        """The subscription's runtime once loaded (None: not loaded here, its store is complete). A
        load or an unload in progress is waited for, up to ``deadline`` (loop time), then
        ``ParkStoreLoading``."""
        loop = asyncio.get_running_loop()
        while True:
            rt = self._service.runtimes.get((topic, subscription))
            if rt is None:
                return None
            # An unload ends by removing it from ``runtimes``, then ``closed``; a failed load too (its
            # ``loaded`` is set after that): either way the next look finds what follows.
            if rt.closing:
                latch = rt.closed
            elif not rt.loaded.is_set():
                latch = rt.loaded
            else:
                return rt
            try:
                await within(latch.wait(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                raise self._loading(topic, subscription, "unloading" if rt.closing else "loading") from None

    async def list(
        self, ctx: RequestContext, topic: str, subscription: str, wait_s: float | None = None
    ) -> list[ParkedKeyInfo]:
        """The parked keys of a subscription, oldest first (from its store if it is not loaded here),
        waiting for a load in progress (``_settled``)."""
        service = self._service
        service.authorizer.authorize(
            ctx, Operation.DESCRIBE, Resource(ResourceType.SUBSCRIPTION, subscription)
        )
        service.authorizer.authorize(ctx, Operation.DESCRIBE, Resource(ResourceType.TOPIC, topic))
        rt = await self._settled(topic, subscription, self._deadline(wait_s))
        if rt is None:
            return await stored_keys(service, topic, subscription)
        machine = rt.machine
        # The monotonic clock of parking, turned into wall-clock ms for the answer.
        now = service.now_ms()
        wall = wall_ms()
        out = []
        for pk in sorted(machine.parking.keys.values(), key=lambda k: k.since_ms):
            p, o = pk.head if pk.head is not None else (-1, -1)  # probing: no head yet
            ps = machine.partitions.get(p)
            count = machine.parking.counts.get((p, o), 0)  # a stored head: parking counts it
            if not count and ps is not None:
                count = ps.cursor.redelivery_count(o)
            out.append(
                ParkedKeyInfo(
                    key=pk.key,
                    state=pk.state.value,
                    since_ms=wall - (now - pk.since_ms),
                    head_partition=p,
                    head_offset=o,
                    head_redelivery_count=count,
                    waiting=sum(1 for m in pk.waiting if (m.partition, m.offset) != pk.head),
                    dispatcher_id=service.dispatcher_id,
                )
            )
        return out

    async def unpark(
        self, ctx: RequestContext, topic: str, subscription: str, key: bytes, wait_s: float | None = None
    ) -> tuple[bool, int]:
        """Release ``key``: its waiting messages go again, counted from 0. (found, messages released).
        A load in progress is waited for (``_settled``): before it is done the key is not in memory
        yet, and an unpark then would answer "not parked" while the load restores it parked. A
        subscription not loaded here is unparked in its store (``_unpark_stored``)."""
        service = self._service
        service.authorizer.authorize(ctx, Operation.ALTER, Resource(ResourceType.SUBSCRIPTION, subscription))
        deadline = self._deadline(wait_s)
        rt = await self._settled(topic, subscription, deadline)
        if rt is None:
            # A Subscribe holds the lock while it loads: waiting for it is waiting for a load, bounded
            # alike (past the deadline nothing was written: the caller may ask again).
            lock = self._locked(topic, subscription)
            try:
                async with asyncio.timeout_at(deadline):  # not wait_for: on 3.11 it can lose an acquired lock
                    await lock.__aenter__()
            except TimeoutError:
                raise self._loading(topic, subscription, "loading") from None
            try:
                rt = await self._settled(topic, subscription, deadline)  # loaded while the lock was awaited
                if rt is None:
                    return await self._unpark_stored(topic, subscription, key)
            finally:
                await lock.__aexit__(None, None, None)
        pk = rt.machine.parking.keys.get(key)
        if pk is None:
            return False, 0
        released = len(pk.waiting)
        rt.call(lambda now: rt.machine.unpark(key, now))
        return True, released

    async def _unpark_stored(self, topic: str, subscription: str, key: bytes) -> tuple[bool, int]:
        """Not loaded (the caller holds the admin lock, so no load begins meanwhile): if the store has
        ``key`` parked on a partition served here, append the ``unpark`` event a loaded subscription
        writes, acknowledged. The next load replays it: the key's count starts again from 0, so its
        head is tried at once instead of staying held (as after a live unpark and a crash)."""
        service = self._service
        book, mine = await _stored(service, topic, subscription)
        waiting = sum(
            len(pk.pending) for ((t, p), k), pk in book.keys.items() if t == topic and p in mine and k == key
        )
        if not waiting:
            return False, 0
        name = sub_park_topic(topic, subscription)
        event = event_record(topic, ParkEvent("unpark", -1, -1, key), int(time.time() * 1000))
        await produce(service.link, service.channels, name, [event])
        log.info("%s: key %r unparked in the store (%d messages; not loaded here)", name, key, waiting)
        return True, waiting
