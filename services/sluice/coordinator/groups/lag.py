"""Consumer lag: committed offsets (Redis, the offset store's keys) against high watermarks (brokers'
``ListOffsets``). The I/O lives in :class:`LagReader`; :func:`lag_rows` and :func:`record_timestamp` are
pure.

Lag = high watermark - committed offset, per (track, topic, partition) - and per member for broadcasting
groups, whose members commit their own offsets. It stays visible while a group has no members: the
committed offsets outlive the members, and ``default`` is always read.

Lag in seconds = now - the timestamp of the first unconsumed record (the one at the committed offset).
:meth:`LagReader.record_timestamps` reads it with one sessionless ``Fetch`` per broker covering every
lagging partition at its committed offset, with a small ``partition_max_bytes``: only the first batch
matters, and its timestamp column gives the record's time without decoding a record.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

import grpc
from redis.asyncio import Redis
from redis.exceptions import RedisError

from sluice.codec.batch import HEADER_SIZE, columns, read_header
from sluice.codec.batch.compression import plain_batch
from sluice.common import list_offsets as planner
from sluice.common.list_offsets import LATEST, LeaderOf
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc
from sluice.coordinator.cluster.records import TopicRecord
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.groups.log_end import FetchHighWatermarks
from sluice.coordinator.groups.model import DEFAULT_TRACK, GroupDescription, MessageModel, Slot
from sluice.coordinator.groups.redis_ops import GroupKeys
from sluice.errors import CorruptBatch, OffsetOutOfRange, StorageError, error_from_proto
from sluice.offsetstore.keys import Keys, split_field
from sluice.v1 import broker_pb2

log = logging.getLogger(__name__)

__all__ = [
    "LagReader",
    "LagRow",
    "lag_positions",
    "lag_rows",
    "record_timestamp",
    "rows_off_loop",
    "time_lag",
]


UNKNOWN = -1

#: Reading first-unconsumed timestamps. The broker returns whole batches, and a batch larger than the
#: room left is returned only when it is the first data of the response (Kafka's minOneMessage): such a
#: partition comes back empty and is fetched again on its own, which always returns its first batch.
PEEK_PARTITION_BYTES = 64 * 1024
PEEK_RESPONSE_BYTES = 8 * 1024 * 1024
#: Single-partition fetches per call at most (oversized batches, offsets below the log start); the
#: partitions beyond it have no lag in seconds until a later refresh.
MAX_SINGLE_PEEKS = 64

#: (topic, partition, offset): "the record at this offset" (or the first one after it).
Position = tuple[str, int, int]


@dataclass(frozen=True, order=True)
class LagRow:
    topic: str
    partition: int
    track: str
    member_id: str
    committed: int
    high_watermark: int
    lag: int


#: (track, topic, partition, member or "") -> committed offset.
Committed = Mapping[tuple[str, str, int, str], int]


def lag_rows(
    description: GroupDescription | None,
    committed: Committed,
    high_watermarks: Mapping[tuple[str, int], int],
) -> list[LagRow]:
    """One row per partition the group reads or has committed, per track (and per member when
    broadcasting). ``lag`` is -1 when either side is unknown."""
    keys: set[tuple[str, str, int, str]] = set(committed)
    if description is not None:
        broadcasting = description.message_model is MessageModel.BROADCASTING
        for m in description.members:
            for a in m.assigned + m.pending_revocation:
                keys.add((a.track, a.topic, a.partition, m.member_id if broadcasting else ""))
        if not broadcasting:
            for topic, _, track in description.track_entries:
                count = description.topics.get(topic, 0)
                keys.update((track, topic, p, "") for p in range(count))
    owners: Mapping[Slot, str] = description.owners if description is not None else {}
    rows = []
    for track, topic, partition, member in sorted(keys):
        offset = committed.get((track, topic, partition, member), UNKNOWN)
        if offset == UNKNOWN and member:
            offset = committed.get((track, topic, partition, ""), UNKNOWN)
        hw = high_watermarks.get((topic, partition), UNKNOWN)
        lag = max(0, hw - offset) if offset >= 0 and hw >= 0 else UNKNOWN
        rows.append(
            LagRow(
                topic, partition, track, member or owners.get((track, topic, partition), ""), offset, hw, lag
            )
        )
    return rows


def lag_positions(rows: Iterable[LagRow]) -> set[Position]:
    """The records whose timestamps give the lag in seconds: the first unconsumed one of each lagging row."""
    return {(r.topic, r.partition, r.committed) for r in rows if r.lag > 0}


def time_lag(row: LagRow, stamps: Mapping[Position, int], now_ms: int) -> tuple[int, int] | None:
    """(ms behind, timestamp of the first unconsumed record) of ``row``: (0, -1) when caught up, None
    when unknown (lag unknown, or that record could not be read)."""
    if row.lag < 0:
        return None
    if row.lag == 0:
        return 0, UNKNOWN
    stamp = stamps.get((row.topic, row.partition, row.committed))
    if stamp is None:
        return None
    return max(0, now_ms - stamp), stamp


def record_timestamp(records: bytes, offset: int) -> int | None:
    """The timestamp (ms) of the record at ``offset`` (or the first one after it: a compacted or
    filtered gap) in ``records``, batches as ``Fetch`` returns them; None if none is there.

    Reads batch headers and one timestamp column entry: ``base_timestamp + timestamp_deltas[i]`` where
    ``offset_deltas[i]`` is the first delta >= ``offset - base_offset``. Never decodes a record.
    """
    pos, end = 0, len(records)
    try:
        while end - pos >= HEADER_SIZE:
            header = read_header(records, pos)
            if header.length < HEADER_SIZE or pos + header.length > end:
                return None  # truncated: the response was cut at its byte limit
            if header.last_offset >= offset:
                plain, ppos, ph = plain_batch(records, pos, header)
                cols = columns(plain, ppos, ph)
                delta = offset - header.base_offset
                deltas = cols.offset_deltas
                # Dense batches (everything the log stores) have offset_deltas[i] == i.
                if 0 <= delta < len(deltas) and deltas[delta] == delta:
                    return header.base_timestamp + int(cols.timestamp_deltas[delta])
                for i, d in enumerate(deltas):
                    if d >= delta:
                        return header.base_timestamp + int(cols.timestamp_deltas[i])
            pos += header.length
    except (CorruptBatch, TypeError, ValueError, IndexError):
        return None  # not a batch we can read: lag in seconds stays unknown, nothing breaks
    return None


#: From this many partitions on, the per-partition work of a lag refresh runs in a worker thread.
_THREAD_MIN = 512


def _leaders(placement: Mapping[str, TopicRecord], endpoints: Mapping[int, str]) -> LeaderOf:
    """The planner's routing, from a snapshot of the placement (it may run in a worker thread)."""

    def leader_of(topic: str, partition: int) -> str | None:
        record = placement.get(topic)
        if record is None or not 0 <= partition < record.partitions:
            return None
        return endpoints.get(record.placement[partition])

    return leader_of


async def rows_off_loop(
    description: GroupDescription | None,
    committed: Committed,
    high_watermarks: Mapping[tuple[str, int], int],
    partitions: int,
) -> list[LagRow]:
    """:func:`lag_rows`; thousands of partitions take tens of milliseconds: then in a worker thread, so
    the event loop keeps answering heartbeats meanwhile (the inputs are the caller's own copies)."""
    if partitions < _THREAD_MIN:
        return lag_rows(description, committed, high_watermarks)
    return await asyncio.to_thread(lag_rows, description, committed, high_watermarks)


class LagReader:
    """Reads committed offsets from Redis and high watermarks from the brokers."""

    def __init__(self, redis: Redis, key_prefix: str, timeout_s: float = 2.0) -> None:
        self._redis = redis
        self._keys = GroupKeys(key_prefix)
        self._offset_keys = Keys(key_prefix)
        self._timeout = timeout_s
        self._peers = AioPeers()

    async def committed(
        self, group: str, tracks: Iterable[str], broadcast_members: Iterable[str] = ()
    ) -> dict[tuple[str, str, int, str], int]:
        tracks = sorted(set(tracks) | {DEFAULT_TRACK})
        members = sorted(broadcast_members)
        sources: list[tuple[str, str, str]] = []  # (redis key, track, member)
        for track in tracks:
            sources.append((self._keys.offsets(group, track), track, ""))
            for mid in members:
                sources.append((self._offset_keys.member_offsets(group, track, mid), track, mid))
        return await self._read_offsets(group, sources)

    async def with_handovers(self, group: str, description: GroupDescription) -> GroupDescription:
        """``description`` with each handed-over binding's start offsets (the copy its handover made:
        ``redis_ops.py``), read in one pipeline."""
        handed = sorted({b.track for b in description.bindings if b.source_track})
        if not handed:
            return description
        sources = [(self._offset_keys.handover(group, t), t, "") for t in handed]
        started = await self._read_offsets(group, sources)
        bindings = tuple(
            replace(
                b,
                handover_offsets={
                    p: o for (tr, t, p, _), o in started.items() if (tr, t) == (b.track, b.topic)
                },
            )
            if b.source_track
            else b
            for b in description.bindings
        )
        return replace(description, bindings=bindings)

    async def _read_offsets(
        self, group: str, sources: list[tuple[str, str, str]]
    ) -> dict[tuple[str, str, int, str], int]:
        """Read ``(redis key, track, member)`` offset hashes in one pipeline."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for key, _, _ in sources:
                    pipe.hgetall(key)
                replies = await pipe.execute()
        except RedisError as exc:
            raise StorageError(f"cannot read the committed offsets of group {group!r}: {exc}") from exc
        out: dict[tuple[str, str, int, str], int] = {}
        for (_, track, mid), reply in zip(sources, replies, strict=True):
            for raw_field, raw_value in reply.items():
                field = raw_field.decode() if isinstance(raw_field, bytes) else str(raw_field)
                try:
                    topic, partition = split_field(field)
                    out[(track, topic, partition, mid)] = int(raw_value)
                except ValueError:
                    continue  # not an offset field; not ours to judge
        return out

    async def high_watermarks(
        self, cluster: ClusterState, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """(topic, partition) -> high watermark, for those whose broker answers (one call per broker).

        Thousands of partitions cost tens of milliseconds of request building and answer parsing: that
        runs in a worker thread (from a snapshot of the placement taken here), so the event loop keeps
        answering heartbeats meanwhile instead of stalling once per lag refresh."""
        wanted = sorted(set(partitions))
        topics = {t for t, _ in wanted}
        placement = {t: cluster.topics[t] for t in topics if t in cluster.topics}
        endpoints = {b.broker_id: str(b.endpoint) for b in cluster.brokers.values()}
        # One round, no retry: lag is best effort, a broker that does not answer leaves its partitions'
        # lag unknown until the next refresh. The planner plans and merges in a worker thread from
        # ``planner.OFFLOAD_MIN`` partitions on.
        answer = await planner.list_offsets(
            self._peers,
            wanted,
            LATEST,
            _leaders(placement, endpoints),
            bound=planner.RetryBound(self._timeout, rounds=1),
            rpc_timeout=self._timeout,
        )
        if answer.errors:
            log.debug("ListOffsets: no high watermark for %d partitions", len(answer.errors))
        return answer.offsets

    async def record_timestamps(
        self, cluster: ClusterState, positions: Iterable[Position]
    ) -> dict[Position, int]:
        """Position -> timestamp (ms) of the record there, for those that could be read.

        One ``Fetch`` per broker covers one position per partition; a partition that comes back without
        its record (a batch bigger than ``PEEK_PARTITION_BYTES``, a second position of the same
        partition, an offset retention already deleted: then the oldest record still there counts) is
        fetched again on its own, at most ``MAX_SINGLE_PEEKS`` of them.
        """
        first: dict[tuple[str, int], int] = {}
        later: list[Position] = []
        for topic, partition, offset in sorted(set(positions)):
            if (topic, partition) in first:
                later.append((topic, partition, offset))  # one fetch position per partition per request
            else:
                first[(topic, partition)] = offset
        plan: dict[str, list[Position]] = {}
        for (topic, partition), offset in first.items():
            address = self._address_of(cluster, topic, partition)
            if address is not None:
                plan.setdefault(address, []).append((topic, partition, offset))
        out: dict[Position, int] = {}
        retry: list[tuple[Position, int]] = [(p, p[2]) for p in later]  # (position, offset to fetch)
        replies = await asyncio.gather(*(self._peek(a, ps) for a, ps in plan.items()))
        for wanted, reply in zip(plan.values(), replies, strict=True):
            self._take_peeks(wanted, reply, out, retry)
        pending = retry[:MAX_SINGLE_PEEKS]
        if len(retry) > MAX_SINGLE_PEEKS:
            log.debug("lag in seconds: %d partitions left for a later refresh", len(retry) - MAX_SINGLE_PEEKS)
        for position, fetch_at in pending:
            address = self._address_of(cluster, position[0], position[1])
            if address is None:
                continue
            reply = await self._peek(address, [(position[0], position[1], fetch_at)])
            self._take_peeks([position], reply, out, None)
        return out

    @staticmethod
    def _address_of(cluster: ClusterState, topic: str, partition: int) -> str | None:
        record = cluster.topics.get(topic)
        if record is None or not 0 <= partition < record.partitions:
            return None
        broker = cluster.brokers.get(record.placement[partition])
        return str(broker.endpoint) if broker is not None else None

    @staticmethod
    def _take_peeks(
        wanted: list[Position],
        reply: broker_pb2.FetchResponse | None,
        out: dict[Position, int],
        retry: list[tuple[Position, int]] | None,
    ) -> None:
        """Read each wanted position's timestamp from ``reply`` (partitions answer in request order);
        queue on ``retry`` what a fetch of that partition alone may still find."""
        if reply is None:
            return
        answers = {(p.topic, p.partition): p for p in reply.partitions}
        for position in wanted:
            topic, partition, offset = position
            answer = answers.get((topic, partition))
            if answer is None:
                continue
            error = error_from_proto(answer.error)
            if error is None:
                # A single-partition retry may have been sent at the log start instead of ``offset``.
                stamp = record_timestamp(answer.records, max(offset, answer.log_start_offset))
                if stamp is not None:
                    out[position] = stamp
                elif retry is not None and offset < answer.high_watermark:
                    retry.append((position, offset))
            elif (
                isinstance(error, OffsetOutOfRange)
                and retry is not None
                and 0 <= offset < answer.log_start_offset < answer.high_watermark
            ):
                # Retention deleted the committed record: the oldest one left is what the group has
                # to read next.
                retry.append((position, answer.log_start_offset))

    async def _peek(self, address: str, positions: list[Position]) -> broker_pb2.FetchResponse | None:
        request = broker_pb2.FetchRequest(
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=PEEK_RESPONSE_BYTES,
            session_id=0,
            session_epoch=-1,  # sessionless: nothing is left open on the broker
            client_id="sluice-coordinator-lag",
        )
        for topic, partition, offset in positions:
            request.partitions.add(
                topic=topic,
                partition=partition,
                fetch_offset=offset,
                partition_max_bytes=PEEK_PARTITION_BYTES,
            )
        try:
            response = await self._peers.broker(address).Fetch(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            log.debug("Fetch (lag timestamps) to %s failed: %s", address, error_from_rpc(exc))
            return None
        refused = error_from_proto(response.error)
        if refused is not None:
            log.debug("Fetch (lag timestamps) to %s refused: %s", address, refused)
            return None
        return response

    async def inputs(
        self, description: GroupDescription | None, group: str
    ) -> tuple[Committed, set[tuple[str, int]]]:
        """The group's committed offsets (Redis) and the partitions whose high watermarks its rows need."""
        tracks = description.tracks if description is not None else (DEFAULT_TRACK,)
        broadcast = (
            [m.member_id for m in description.members]
            if description is not None and description.message_model is MessageModel.BROADCASTING
            else []
        )
        committed = await self.committed(group, tracks, broadcast)
        wanted = {(t, p) for (_, t, p, _) in committed}
        if description is not None:
            wanted |= {(t, p) for t, n in description.topics.items() for p in range(n)}
        return committed, wanted

    async def rows(
        self,
        cluster: ClusterState,
        description: GroupDescription | None,
        group: str,
        high_watermarks: FetchHighWatermarks | None = None,
    ) -> list[LagRow]:
        """The group's lag rows; high watermarks from ``high_watermarks`` (the shared log-end cache,
        ``log_end.py``), else asked of the brokers here."""
        committed, wanted = await self.inputs(description, group)
        ends = await (high_watermarks or self.high_watermarks)(cluster, wanted)
        return await rows_off_loop(description, committed, ends, len(wanted))

    async def close(self) -> None:
        await self._peers.close()
