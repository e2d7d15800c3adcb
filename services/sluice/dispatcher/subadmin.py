"""Subscription admin on one dispatcher: reset, skip, delete, peek (docs/dispatcher.md).

Each dispatcher acts on the partitions of the topic routed to it; the SDK asks every dispatcher
serving the topic and merges the answers (``client/push/sub_admin.py``).

A change (reset, skip, delete) needs the subscription to itself: it runs under the subscription's
admin lock, which ``DispatcherService.subscribe`` also takes around loading and joining, so no
consumer can attach halfway. Connected consumers make it ``SUBSCRIPTION_IN_USE`` unless ``force``:
then their streams end (``NOT_DISPATCHER`` after a reset or skip, so the SDK reconnects at the new
position; ``UNKNOWN_SUBSCRIPTION`` after a delete, which is final for them). The subscription is then
unloaded (its cursors flushed) and the change is made on the stored cursors, written with this
dispatcher's owner epoch like any cursor flush. Input is checked and positions are resolved before
anything is disconnected, so bad input changes nothing.

Peek changes nothing: it reads the cursor (the live one of a loaded subscription, else the stored
one) and fetches from the broker, with the subscription's filter, the first ``count`` records that
are not acknowledged, in flight ones included (Pulsar's peek). Skip acknowledges exactly the records
a peek of the same count shows.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from sluice.codec.batch import Record, decode_records
from sluice.common.names import validate_group, validate_topic
from sluice.common.rpc import error_from_rpc
from sluice.dispatcher.answers import DeleteResult, PartitionPosition, PeekedMessage, ResetResult, SkipResult
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.cursor_store import DirtyCursor
from sluice.dispatcher.host import ServiceHost
from sluice.dispatcher.registry import SubscriptionBook, wall_ms
from sluice.dispatcher.requests import DeleteRequest, PeekRequest, ResetRequest, ResetSpec, SkipRequest
from sluice.errors import (
    InvalidArgument,
    InvalidRequest,
    NotDispatcher,
    SubscriptionInUse,
    UnknownSubscription,
    UnknownTopicOrPartition,
    raise_for_proto,
)
from sluice.security.context import Operation, RequestContext
from sluice.security.model import Resource, ResourceType
from sluice.v1 import broker_pb2, offset_store_pb2

__all__ = ["SubscriptionAdmin"]

SubKey = tuple[str, str]
MAX_PEEK = 1000
PEEK_FETCH_BYTES = 1024 * 1024
#: Fetches per partition for one peek: bounds the work when the filter skips most of a long log.
MAX_PEEK_FETCHES = 64
#: A "future" time is one later than now plus this slack (clocks of client and dispatcher differ).
CLOCK_SLACK_MS = 5000


class SubscriptionAdmin:
    def __init__(self, service: ServiceHost, book: SubscriptionBook) -> None:
        self._service = service
        self._book = book
        #: Per subscription: its lock and how many tasks hold or wait for it (the lock is forgotten at 0,
        #: never while someone waits: a new lock then would let two tasks in at once).
        self._locks: dict[SubKey, tuple[asyncio.Lock, list[int]]] = {}

    @contextlib.asynccontextmanager
    async def locked(self, topic: str, subscription: str) -> AsyncIterator[None]:
        """The subscription's admin lock (also held by a Subscribe while it loads and joins)."""
        key = (topic, subscription)
        lock, users = self._locks.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[key]

    # ---- shared steps --------------------------------------------------------------------------------

    async def _partitions(
        self, ctx: RequestContext, op: Operation, topic: str, subscription: str
    ) -> list[int]:
        """Validate the names, authorize ``op`` on the subscription (and reading the topic's records,
        for a peek; describing the topic otherwise); the topic's partitions routed here."""
        validate_topic(topic)
        validate_group(subscription, "subscription")
        service = self._service
        service.authorizer.authorize(ctx, op, Resource(ResourceType.SUBSCRIPTION, subscription))
        topic_op = Operation.READ if op is Operation.READ else Operation.DESCRIBE
        service.authorizer.authorize(ctx, topic_op, Resource(ResourceType.TOPIC, topic))
        await service.link.topic(topic)  # UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist
        return service.link.view.partitions_of(topic, service.dispatcher_id)

    async def _known(self, topic: str, subscription: str) -> offset_store_pb2.StoredSubscription | None:
        """The registry entry; raises UNKNOWN_SUBSCRIPTION when neither registered nor loaded here."""
        record = await self._book.lookup(topic, subscription)
        if record is None and (topic, subscription) not in self._service.runtimes:
            raise UnknownSubscription(
                f"topic {topic!r} has no subscription {subscription!r} (never created, or deleted; a "
                "non-durable one exists only while consumers are connected)"
            )
        return record

    async def _unload(self, topic: str, subscription: str, force: bool, deleting: bool) -> int:
        """Hold the lock. End the consumers' streams (only with ``force``), unload: streams ended."""
        service = self._service
        rt = service.runtimes.get((topic, subscription))
        if rt is None:
            return 0
        await rt.loaded.wait()
        streams = list(rt.streams.values())
        if streams and not force:
            raise SubscriptionInUse(
                f"subscription {subscription!r} of topic {topic!r} has {len(streams)} consumer(s) "
                f"connected to dispatcher {service.dispatcher_id!r}: stop them, or pass force (--force) "
                "to disconnect them"
            )
        err = (
            UnknownSubscription(
                f"subscription {subscription!r} of topic {topic!r} was deleted by an operator"
            )
            if deleting
            else NotDispatcher(f"subscription {subscription!r} of topic {topic!r} was reset: reconnect")
        )
        for stream in streams:
            stream.fail(err)
        await service.drop(rt)
        return len(streams)

    async def _load_cursors(
        self, topic: str, subscription: str, partitions: list[int]
    ) -> dict[int, PartitionCursor]:
        store = self._service.store
        loaded = await asyncio.gather(*(store.load(topic, subscription, p) for p in partitions))
        return {p: c for p, c in zip(partitions, loaded, strict=True) if c is not None}

    async def _save(
        self, topic: str, subscription: str, cursors: list[PartitionCursor], topic_id: str
    ) -> None:
        """Write ``cursors`` for the incarnation ``topic_id`` (read before the targets were computed): the
        offset store refuses them if the topic was deleted or re-created meanwhile."""
        service = self._service
        for c in cursors:
            c.version += 1  # dirty: the store writes it
        fenced = await service.store.save(
            [DirtyCursor(topic, subscription, c, topic_id) for c in cursors], service.link.epoch
        )
        if fenced:
            raise NotDispatcher(
                f"another dispatcher took over {topic}/{subscription}, or its topic was deleted or "
                "re-created, while it was changed: retry the command"
            )
        self._book.set_positions(
            topic, subscription, {c.partition: (c.mark_delete, c.acked.count()) for c in cursors}
        )

    # ---- reset ---------------------------------------------------------------------------------------

    async def reset(self, ctx: RequestContext, req: ResetRequest) -> ResetResult:
        mine = await self._partitions(ctx, Operation.ALTER, req.topic, req.subscription)
        wanted = sorted(set(req.partitions)) if req.partitions else mine
        if any(p < 0 for p in wanted):
            raise InvalidArgument(f"partitions must be >= 0, got {wanted}")
        desc = await self._service.link.topic(req.topic)
        count = len(desc.partitions)
        if wanted and wanted[-1] >= count:
            raise UnknownTopicOrPartition(f"topic {req.topic!r} has {count} partitions, not {wanted[-1] + 1}")
        wanted = [p for p in wanted if p in mine]  # the others are another dispatcher's
        if not wanted:
            return ResetResult()  # nothing here to change: disconnect no one
        targets = await self._targets(req, wanted)
        async with self.locked(req.topic, req.subscription):
            record = await self._known(req.topic, req.subscription)
            if record is None:
                raise InvalidRequest(
                    f"subscription {req.subscription!r} of topic {req.topic!r} is not durable: it has no "
                    "stored position to reset (reconnect its consumers with another initial position)"
                )
            disconnected = await self._unload(req.topic, req.subscription, req.force, deleting=False)
            before = await self._load_cursors(req.topic, req.subscription, wanted)
            cursors = [PartitionCursor(p, mark_delete=targets[p][0]) for p in wanted]
            await self._save(req.topic, req.subscription, cursors, desc.topic_id)
        return ResetResult(
            partitions=[
                PartitionPosition(
                    partition=p,
                    before=before[p].mark_delete if p in before else -1,
                    after=targets[p][0],
                    note=targets[p][1],
                )
                for p in wanted
            ],
            disconnected=disconnected,
        )

    async def _targets(self, req: ResetRequest, partitions: list[int]) -> dict[int, tuple[int, str]]:
        """partition -> (new mark-delete, note when the asked position was clamped)."""
        service = self._service
        if not partitions:
            return {}
        earliest = await service.list_offsets(req.topic, partitions, -2)
        latest = await service.list_offsets(req.topic, partitions, -1)
        spec = req.spec
        if spec == ResetSpec.EARLIEST:
            return {p: (earliest[p], "") for p in partitions}
        if spec == ResetSpec.LATEST:
            return {p: (latest[p], "") for p in partitions}
        if spec == ResetSpec.TIMESTAMP:
            now = wall_ms()
            if req.value > now + CLOCK_SLACK_MS:
                raise InvalidArgument(
                    f"reset time {req.value} ms is in the future (now is {now} ms): nothing was produced then"
                )
            if req.value < 0:
                raise InvalidArgument(f"reset time must be >= 0 ms, got {req.value}")
            found = await service.list_offsets(req.topic, partitions, req.value)
            return {p: (found[p], "") for p in partitions}
        if spec != ResetSpec.OFFSET:
            raise InvalidArgument(f"unknown reset spec {spec}")
        out: dict[int, tuple[int, str]] = {}
        for p in partitions:
            if req.value > latest[p]:
                out[p] = (
                    latest[p],
                    f"offset {req.value} is past the log end {latest[p]}: clamped to the log end",
                )
            elif req.value < earliest[p]:
                out[p] = (
                    earliest[p],
                    f"offset {req.value} is below the log start {earliest[p]}: clamped to the log start",
                )
            else:
                out[p] = (req.value, "")
        return out

    # ---- skip ----------------------------------------------------------------------------------------

    async def skip(self, ctx: RequestContext, req: SkipRequest) -> SkipResult:
        if not 0 < req.count <= MAX_PEEK:
            raise InvalidArgument(f"count must be from 1 to {MAX_PEEK}, got {req.count}")
        mine = await self._partitions(ctx, Operation.ALTER, req.topic, req.subscription)
        topic_id = (await self._service.link.topic(req.topic)).topic_id
        async with self.locked(req.topic, req.subscription):
            record = await self._known(req.topic, req.subscription)
            if record is None:
                raise InvalidRequest(
                    f"subscription {req.subscription!r} of topic {req.topic!r} is not durable: nothing to "
                    "skip outside its consumers"
                )
            disconnected = await self._unload(req.topic, req.subscription, req.force, deleting=False)
            cursors = await self._load_cursors(req.topic, req.subscription, mine)
            found = await self._next(req.topic, record.filter, cursors, req.count)
            by_partition: dict[int, list[int]] = {}
            for r in found:
                by_partition.setdefault(r.partition, []).append(r.offset)
            before = {p: cursors[p].mark_delete for p in by_partition}
            for p, offsets in by_partition.items():
                cursors[p].ack_sorted(sorted(offsets))
            await self._save(req.topic, req.subscription, [cursors[p] for p in by_partition], topic_id)
        return SkipResult(
            skipped=[(r.partition, r.offset) for r in found],
            partitions=[
                PartitionPosition(partition=p, before=before[p], after=cursors[p].mark_delete)
                for p in sorted(by_partition)
            ],
            disconnected=disconnected,
        )

    # ---- delete --------------------------------------------------------------------------------------

    async def delete(self, ctx: RequestContext, req: DeleteRequest) -> DeleteResult:
        mine = await self._partitions(ctx, Operation.DELETE, req.topic, req.subscription)
        async with self.locked(req.topic, req.subscription):
            await self._known(req.topic, req.subscription)
            disconnected = await self._unload(req.topic, req.subscription, req.force, deleting=True)
            # Every partition's cursor goes (not only those routed here: a stale one would come back
            # as the starting position of a re-created subscription); the registry entry last.
            count = len((await self._service.link.topic(req.topic)).partitions)
            await self._book.delete(req.topic, req.subscription, list(range(count)), unregister=True)
        return DeleteResult(partitions=mine, disconnected=disconnected)

    # ---- peek ----------------------------------------------------------------------------------------

    async def peek(self, ctx: RequestContext, req: PeekRequest) -> list[PeekedMessage]:
        if not 0 < req.count <= MAX_PEEK:
            raise InvalidArgument(f"count must be from 1 to {MAX_PEEK}, got {req.count}")
        mine = await self._partitions(ctx, Operation.READ, req.topic, req.subscription)
        rt = self._service.runtimes.get((req.topic, req.subscription))
        if rt is not None and not rt.closing:
            await rt.loaded.wait()
            cursors = {p: ps.cursor for p, ps in rt.machine.partitions.items()}
            expression = rt.machine.settings.filter.expression
        else:
            record = await self._known(req.topic, req.subscription)
            assert record is not None  # not loaded and known: registered
            cursors = await self._load_cursors(req.topic, req.subscription, mine)
            expression = record.filter
        found = await self._next(req.topic, expression, cursors, req.count)
        return [PeekedMessage(r, cursors[r.partition].redelivery_count(r.offset)) for r in found]

    async def _next(
        self, topic: str, expression: str, cursors: dict[int, PartitionCursor], count: int
    ) -> list[Record]:
        """The first ``count`` unacknowledged records matching the filter: up to ``count`` per partition,
        then the oldest ``count`` of those by (timestamp, partition, offset)."""
        if not cursors:
            return []
        # Offsets below the log start are gone (retention) and count as acknowledged.
        starts = await self._service.list_offsets(topic, sorted(cursors), -2)
        per_partition = await asyncio.gather(
            *(
                self._scan(topic, p, expression, c, max(c.mark_delete, starts[p]), count)
                for p, c in sorted(cursors.items())
            )
        )
        found = [r for rs in per_partition for r in rs]
        return sorted(found, key=lambda r: (r.timestamp, r.partition, r.offset))[:count]

    async def _scan(
        self, topic: str, partition: int, expression: str, cursor: PartitionCursor, position: int, count: int
    ) -> list[Record]:
        """Up to ``count`` unacknowledged records of one partition from ``position``, in offset order."""
        service = self._service
        stub = service.channels.broker(service.link.broker_for(topic, partition))
        out: list[Record] = []
        for _ in range(MAX_PEEK_FETCHES):
            request = broker_pb2.FetchRequest(
                max_wait_ms=0,
                max_bytes=PEEK_FETCH_BYTES,
                session_epoch=-1,
                partitions=[
                    broker_pb2.FetchPartition(
                        topic=topic,
                        partition=partition,
                        fetch_offset=position,
                        partition_max_bytes=PEEK_FETCH_BYTES,
                        filter="" if expression == "*" else expression,
                    )
                ],
            )
            try:
                resp = await stub.Fetch(request, timeout=10)
            except grpc.RpcError as exc:
                raise error_from_rpc(exc) from None
            part = resp.partitions[0]
            raise_for_proto(part.error)
            fresh = [
                r
                for r in decode_records(part.records, topic, partition, position)
                if not cursor.is_acked(r.offset)
            ]
            out += fresh[: count - len(out)]
            if len(out) == count or part.next_offset <= position or part.next_offset >= part.high_watermark:
                break
            position = part.next_offset
        return out
