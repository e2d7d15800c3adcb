"""Durable subscriptions live until they are deleted: the registry, and the idle ones it lists.

A durable subscription is recorded in the offset store's registry (``{P}:subs``, one Redis hash;
``offsetstore/subscriptions.py``) when a dispatcher first loads it, and touched (last-active time) as
consumers come and go. The dispatcher still unloads a subscription ``--idle-subscription-linger``
after its last consumer (no feeds, no read-ahead, no timers for nobody), but it keeps listing it:
:class:`SubscriptionBook` holds, for each registered durable subscription that is not loaded here and
has partitions routed here, its position per partition (mark-delete and the count of acknowledged
offsets above it). A restarted dispatcher, or another replica, rebuilds that from the registry.

Cheap by construction. Nobody acknowledges anything for an idle subscription, so its positions change
only through this dispatcher (admin commands, or unloading it, which hands the positions over without
I/O); they are read from the offset store once (``LoadCursor``), when the book first sees the
subscription. What moves is the log end: each refresh asks one ``ListOffsets`` per topic (per broker
holding its partitions), however many idle subscriptions the topic has. A refresh runs every
``--subscription-refresh-interval`` (metrics read the book as it is) and before answering
``ListSubscriptions`` / ``DescribeSubscription`` (so the CLI is exact).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from sluice.common.rpc import error_from_rpc
from sluice.errors import LimitExceeded, SluiceError, StorageError, echo, error_from_proto
from sluice.v1 import offset_store_pb2, offset_store_pb2_grpc

if TYPE_CHECKING:
    from sluice.dispatcher.config import DispatcherConfig
    from sluice.dispatcher.cursor import PartitionCursor
    from sluice.dispatcher.host import ServiceHost
    from sluice.dispatcher.runtime import SubscriptionRuntime

log = logging.getLogger(__name__)

__all__ = ["IdleSubscription", "SubscriptionBook", "check_room", "wall_ms"]

SubKey = tuple[str, str]
RPC_TIMEOUT = 10.0
#: A partition whose cursor is not in the offset store (never flushed): no backlog is claimed for it.
UNKNOWN_POSITION = -1
MAX_PARALLEL_LOADS = 32


def wall_ms() -> int:
    """Wall-clock ms: last-active times are shown to operators and compared across dispatchers."""
    return int(time.time() * 1000)


@dataclass(slots=True)
class IdleSubscription:
    """A registered durable subscription not loaded here, on the partitions routed here."""

    record: offset_store_pb2.StoredSubscription
    #: partition -> (mark_delete, acknowledged offsets above it), or (UNKNOWN_POSITION, 0).
    positions: dict[int, tuple[int, int]] = field(default_factory=dict)


class SubscriptionBook:
    """The registry client and the idle subscriptions of one dispatcher. Caller: ``DispatcherService``."""

    def __init__(self, service: ServiceHost) -> None:
        self._service = service
        self.idle: dict[SubKey, IdleSubscription] = {}
        #: (topic, partition) -> log end, for the partitions of idle subscriptions.
        self.ends: dict[tuple[str, int], int] = {}
        self._pending: dict[SubKey, offset_store_pb2.StoredSubscription] = {}
        self._refresh_lock = asyncio.Lock()

    def _stub(self) -> offset_store_pb2_grpc.OffsetStoreAsyncStub:
        address = self._service.store.address
        if not address:
            raise StorageError("no offset store is known yet to keep durable subscriptions in")
        return self._service.channels.offset_store(address)

    # ---- the registry --------------------------------------------------------------------------------

    @staticmethod
    def record_of(rt: SubscriptionRuntime) -> offset_store_pb2.StoredSubscription:
        settings = rt.machine.settings
        return offset_store_pb2.StoredSubscription(
            topic=rt.topic,
            subscription=rt.name,
            type=int(settings.type),
            filter=settings.filter.expression,
            created_ms=wall_ms(),  # the registry keeps the first one
            last_active_ms=rt.last_active_ms or wall_ms(),
            topic_id=rt.topic_id,
        )

    async def register(self, rt: SubscriptionRuntime) -> None:
        """Record a durable subscription before it is loaded (a failure fails the Subscribe, retriably)."""
        self.idle.pop((rt.topic, rt.name), None)
        await self._touch([self.record_of(rt)])

    def touch(self, rt: SubscriptionRuntime) -> None:
        """Note a consumer change; sent with the next cursor flush."""
        if rt.durable:
            self._pending[(rt.topic, rt.name)] = self.record_of(rt)

    async def flush_touches(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, {}
        try:
            await self._touch(list(batch.values()))
        except SluiceError as exc:
            log.warning("could not record %d subscription(s) in the registry: %s", len(batch), exc)
            self._pending = {**batch, **self._pending}

    async def _touch(self, records: list[offset_store_pb2.StoredSubscription]) -> None:
        """Record ``records``. One whose topic was deleted (or re-created) since it was loaded is refused
        by topic id and dropped: it is over (the dispatcher fails its streams when it sees the delete),
        and retrying would only be refused again."""
        try:
            resp = await self._stub().TouchSubscriptions(
                offset_store_pb2.TouchSubscriptionsRequest(subscriptions=records), timeout=RPC_TIMEOUT
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        for record, answer in zip(records, resp.errors, strict=False):
            error = error_from_proto(answer)
            if error is not None:
                log.info(
                    "subscription %s/%s not recorded: %s", record.topic, record.subscription, error.message
                )

    async def stored(self, topic: str = "") -> list[offset_store_pb2.StoredSubscription]:
        try:
            resp = await self._stub().ListStoredSubscriptions(
                offset_store_pb2.ListStoredSubscriptionsRequest(topic=topic), timeout=RPC_TIMEOUT
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return list(resp.subscriptions)

    async def lookup(self, topic: str, subscription: str) -> offset_store_pb2.StoredSubscription | None:
        for r in await self.stored(topic):
            if r.subscription == subscription:
                return r
        return None

    async def delete(self, topic: str, subscription: str, partitions: list[int], unregister: bool) -> int:
        """Remove the stored cursors of ``partitions`` (and the registry entry): Redis keys removed."""
        self._pending.pop((topic, subscription), None)
        self.idle.pop((topic, subscription), None)
        try:
            resp = await self._stub().DeleteSubscriptionState(
                offset_store_pb2.DeleteSubscriptionStateRequest(
                    topic=topic, subscription=subscription, partitions=partitions, unregister=unregister
                ),
                timeout=RPC_TIMEOUT,
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        return resp.deleted_keys

    # ---- idle subscriptions --------------------------------------------------------------------------

    def remember(self, rt: SubscriptionRuntime) -> None:
        """``rt`` was unloaded with its cursors persisted: keep its positions (no I/O)."""
        self.idle[(rt.topic, rt.name)] = IdleSubscription(
            self.record_of(rt),
            {p: (ps.cursor.mark_delete, ps.cursor.acked.count()) for p, ps in rt.machine.partitions.items()},
        )

    def set_positions(self, topic: str, subscription: str, positions: dict[int, tuple[int, int]]) -> None:
        """An admin command wrote these positions."""
        entry = self.idle.get((topic, subscription))
        if entry is not None:
            entry.positions.update(positions)

    def backlog(self, entry: IdleSubscription) -> int:
        topic = entry.record.topic
        total = 0
        for p, (mark_delete, acked) in entry.positions.items():
            end = self.ends.get((topic, p))
            if end is not None and mark_delete != UNKNOWN_POSITION:
                total += max(end - mark_delete - acked, 0)
        return total

    async def refresh(self) -> None:
        """Re-read the registry, load the positions of newly seen idle subscriptions, and read the log
        ends of their topics. Concurrent callers wait for one refresh in progress, then run their own."""
        async with self._refresh_lock:
            await self._refresh()

    async def _refresh(self) -> None:
        service = self._service
        records = await self.stored()
        view = service.link.view
        wanted: dict[SubKey, tuple[offset_store_pb2.StoredSubscription, list[int]]] = {}
        for r in records:
            key = (r.topic, r.subscription)
            rt = service.runtimes.get(key)
            if rt is not None and not rt.closing:
                continue
            mine = view.partitions_of(r.topic, service.dispatcher_id)
            if mine:
                wanted[key] = (r, mine)
        for key in [k for k in self.idle if k not in wanted]:
            del self.idle[key]
        loads = []
        for key, (record, mine) in wanted.items():
            entry = self.idle.setdefault(key, IdleSubscription(record))
            entry.record = record
            for p in [p for p in entry.positions if p not in mine]:
                del entry.positions[p]
            loads += [(entry, p) for p in mine if p not in entry.positions]
        # Bounded: after a restart a dispatcher may see thousands of idle cursors at once.
        gate = asyncio.Semaphore(MAX_PARALLEL_LOADS)

        async def load(entry: IdleSubscription, partition: int) -> PartitionCursor | None:
            async with gate:
                return await service.store.load(entry.record.topic, entry.record.subscription, partition)

        cursors = await asyncio.gather(*(load(e, p) for e, p in loads))
        for (entry, p), cur in zip(loads, cursors, strict=True):
            entry.positions[p] = (cur.mark_delete, cur.acked.count()) if cur else (UNKNOWN_POSITION, 0)
        topics: dict[str, set[int]] = {}
        for entry in self.idle.values():
            topics.setdefault(entry.record.topic, set()).update(entry.positions)
        ends: dict[tuple[str, int], int] = {}
        for topic, parts in topics.items():
            try:
                latest = await service.list_offsets(topic, sorted(parts), -1)
            except SluiceError as exc:  # a deleted topic, a broker down: keep the last known ends
                log.debug("log ends of %s: %s", topic, exc)
                ends.update({(topic, p): e for (t, p), e in self.ends.items() if t == topic})
                continue
            ends.update({(topic, p): e for p, e in latest.items()})
        self.ends = ends

    async def refresh_loop(self, interval: float) -> None:
        while True:
            try:
                await self.refresh()
            except SluiceError as exc:
                log.warning("refreshing idle subscriptions failed: %s", exc)
            except Exception:  # never let the loop die
                log.exception("refreshing idle subscriptions failed")
            await asyncio.sleep(interval)


def check_room(
    runtimes: Mapping[tuple[str, str], SubscriptionRuntime],
    book: SubscriptionBook,
    key: tuple[str, str],
    consumer_id: str,
    config: DispatcherConfig,
) -> None:
    """Refuse a Subscribe that would open one subscription more than ``max_subscriptions`` (those loaded
    and the idle durable ones this dispatcher lists) or attach one consumer more than
    ``max_consumers_per_subscription`` (a consumer reconnecting under its id is not one more)."""
    rt = runtimes.get(key)
    if rt is None:
        limit = config.max_subscriptions
        held = len(runtimes) + sum(1 for k in book.idle if k not in runtimes and k != key)
        if limit and held >= limit:
            raise LimitExceeded(
                f"subscriptions: {held + 1} would exceed the limit max_subscriptions={limit}",
                limit="max_subscriptions",
                value=limit,
            )
        return
    per = config.max_consumers_per_subscription
    consumers = rt.streams
    if per and consumer_id not in consumers and len(consumers) >= per:
        raise LimitExceeded(
            f"consumers of subscription {echo(key[1])} on topic {echo(key[0])}: {len(consumers) + 1} would "
            f"exceed the limit max_consumers_per_subscription={per}",
            limit="max_consumers_per_subscription",
            value=per,
        )
