"""Fetch planning: request limits and the read state of one fetch request.

Kafka's fetch semantics (architecture §2, docs/fetch.md), in the part that needs no I/O of
its own beyond reading logs:

- ``max_bytes`` bounds the whole response and ``partition_max_bytes`` each partition, but
  the first batch of the first non-empty partition is returned even when it is larger
  (Kafka's ``minOneMessage``), so one big batch never blocks a consumer;
- partitions are read in request order, each with ``min(partition room, response room)``;
- a filtered partition walks raw batches and keeps only matching records, bounded by a scan
  budget so a selective filter over a big backlog still answers promptly; ``next_offset``
  moves past everything walked;
- ``FetchRead`` accumulates: a parked (long-poll) request reads again only the partitions an
  append woke it for, continuing where it stopped, so waking costs the new bytes only.

Caller: ``sluice.broker.service`` (and the unit tests, with an in-memory log).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from sluice.codec.filter import parse_filter
from sluice.codec.sql_filter import SqlFilter
from sluice.errors import InvalidArgument, OffsetOutOfRange, SluiceError, StorageError

TopicPartitionKey = tuple[str, int]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FetchCaps:
    """Broker-side bounds and defaults for fetch requests (from BrokerConfig)."""

    #: ``max_wait_ms`` above this is refused with INVALID_ARGUMENT.
    max_wait_ms: int = 30_000
    #: ``max_bytes`` above this is refused; 0 in a request means this value.
    max_bytes: int = 64 * MiB
    #: What ``partition_max_bytes = 0`` means (Kafka's max.partition.fetch.bytes default).
    default_partition_max_bytes: int = 1 * MiB
    #: Raw log bytes a filtered partition may walk per request before it answers anyway.
    scan_bytes: int = 4 * MiB
    #: Raw bytes read from the log per step of a filtered scan.
    scan_chunk_bytes: int = 1 * MiB
    #: The most record bytes put in one response, whatever max_bytes says: it has to fit in
    #: one gRPC message (64 MiB) together with its framing.
    response_bytes_ceiling: int = 63 * MiB


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """Validated request-level limits."""

    max_wait_ms: int
    min_bytes: int
    max_bytes: int


def validate_limits(max_wait_ms: int, min_bytes: int, max_bytes: int, caps: FetchCaps) -> FetchLimits:
    """Check request-level limits; raises InvalidArgument naming the bad field.

    ``max_wait_ms <= 0`` means answer at once; ``max_bytes = 0`` means the broker's cap;
    ``min_bytes = 0`` means answer at once too (zero bytes are always ready).
    """
    if max_wait_ms > caps.max_wait_ms:
        raise InvalidArgument(f"max_wait_ms {max_wait_ms} exceeds the broker's cap of {caps.max_wait_ms} ms")
    if min_bytes < 0:
        raise InvalidArgument(f"min_bytes must be >= 0, got {min_bytes}")
    if max_bytes < 0:
        raise InvalidArgument(f"max_bytes must be >= 0, got {max_bytes}")
    if max_bytes > caps.max_bytes:
        raise InvalidArgument(f"max_bytes {max_bytes} exceeds the broker's cap of {caps.max_bytes} bytes")
    effective = min(max_bytes or caps.max_bytes, caps.response_bytes_ceiling)
    return FetchLimits(max(max_wait_ms, 0), min_bytes, effective)


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    """One partition of a fetch request, as the client asked for it."""

    topic: str
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    filter: str = ""
    #: The leader epoch the fetcher believes current (-1: unknown, not checked).
    current_leader_epoch: int = -1
    #: A follower's fetch: where its fsync'ed log ends (-1: unknown).
    replica_flushed_offset: int = -1

    @property
    def key(self) -> TopicPartitionKey:
        return (self.topic, self.partition)


class ReadChunk(Protocol):
    """What ``PartitionLog.read`` returns."""

    @property
    def data(self) -> bytes: ...
    @property
    def next_offset(self) -> int: ...


class ReadableLog(Protocol):
    """The part of ``PartitionLog`` a fetch uses."""

    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def high_watermark(self) -> int:
        """The read bound: records below it only (the log end where nothing is replicated)."""
        ...

    def read(self, offset: int, max_bytes: int, min_one: bool = True) -> ReadChunk: ...


@dataclass(slots=True)
class PartitionRead:
    """The state of one partition within one fetch request."""

    spec: PartitionSpec
    log: ReadableLog | None
    #: None: every record matches (no filter, or ``*``).
    tags: frozenset[str] | None = None
    #: An SQL92 filter (docs/filters.md); ``tags`` is then None.
    sql: SqlFilter | None = None
    error: SluiceError | None = None
    #: The partition's ``next_offset`` so far: after everything returned or skipped.
    position: int = 0
    batches: list[bytes] = field(default_factory=list)
    out_bytes: int = 0
    #: Raw bytes a filtered read has walked in this request.
    scanned: int = 0
    #: Nothing more fits for this partition in this request (its own or the response limit).
    full: bool = False
    #: A filtered read used up its scan budget with more log still to walk.
    scan_budget_hit: bool = False
    high_watermark: int = -1
    log_start_offset: int = -1

    @property
    def key(self) -> TopicPartitionKey:
        return self.spec.key

    @property
    def records(self) -> bytes:
        if not self.batches:
            return b""
        if len(self.batches) == 1:
            return self.batches[0]
        return b"".join(self.batches)

    @property
    def skipped_all(self) -> bool:
        """A filter skipped records and kept none: the position moved with nothing to send."""
        filtered = self.tags is not None or self.sql is not None
        return filtered and not self.out_bytes and self.position != self.spec.fetch_offset

    def fail(self, error: SluiceError) -> None:
        self.error = error
        self.batches.clear()
        self.out_bytes = 0
        self.high_watermark = -1
        self.log_start_offset = -1

    def refresh_marks(self) -> None:
        """Copy the log's current high watermark and log start into the answer."""
        if self.error is None and self.log is not None:
            self.high_watermark = self.log.high_watermark
            self.log_start_offset = self.log.log_start_offset


def prepare_partition(spec: PartitionSpec, log: ReadableLog | None, caps: FetchCaps) -> PartitionRead:
    """Per-partition validation that does not need the log's contents.

    ``log`` is None when the service already decided the partition is not served here; the
    caller then sets the error itself.
    """
    part = PartitionRead(spec=spec, log=log, position=spec.fetch_offset)
    try:
        if spec.partition_max_bytes < 0:
            raise InvalidArgument(f"partition_max_bytes must be >= 0, got {spec.partition_max_bytes}")
        if spec.partition_max_bytes > caps.max_bytes:
            raise InvalidArgument(
                f"partition_max_bytes {spec.partition_max_bytes} exceeds the broker's cap of {caps.max_bytes}"
            )
        flt = parse_filter(spec.filter)
        part.tags, part.sql = flt.tags, flt.sql
        if spec.fetch_offset < 0:
            raise OffsetOutOfRange(f"fetch offset {spec.fetch_offset} is negative")
    except SluiceError as err:
        part.fail(err)
    return part


class FetchRead:
    """Accumulates the answer of one fetch request across reads (initial and after wake-ups).

    Caller: the service, which creates it, calls :meth:`read` once, and, while the request is
    parked, again with the partitions an append woke it for.
    Affects: only its own ``PartitionRead`` objects.

    A session's request or a follow's round reads only the partitions that may have something
    new; ``others`` counts the rest of its partitions (caught up when the read began, so an
    append could still add to them): the read waits for them, and :meth:`add` brings one in
    when an append wakes it.
    """

    def __init__(
        self, parts: list[PartitionRead], limits: FetchLimits, caps: FetchCaps, others: int = 0
    ) -> None:
        self.parts = parts
        self.limits = limits
        self.caps = caps
        self.others = others
        self.total_bytes = 0
        #: Bytes this read holds in the broker's fetch memory pool (``memory.py``).
        self.held = 0
        self.index = {part.key: part for part in parts}
        #: Set once the request waits for appends (``longpoll.ParkedRead.park``): from then on, records a
        #: filter skipped no longer answer it early (see :meth:`ready`).
        self.parked = False

    def add(self, part: PartitionRead) -> None:
        """One of the ``others`` joins the read (an append woke it)."""
        self.parts.append(part)
        self.index[part.key] = part
        self.others = max(self.others - 1, 0)

    @property
    def room(self) -> int:
        return self.limits.max_bytes - self.total_bytes

    def read(self, only: Collection[TopicPartitionKey] | None = None) -> None:
        """Read every partition (or those in ``only``) in request order, within the limits."""
        if only is None or len(only) > 1:
            parts = self.parts if only is None else [p for p in self.parts if p.key in only]
        else:  # a wake-up: one partition, found without a walk over the others
            parts = [self.index[key] for key in only if key in self.index]
        for part in parts:
            if part.error is not None or part.full or part.log is None:
                continue
            try:
                if part.tags is None and part.sql is None:
                    self._read_plain(part, part.log)
                else:
                    self._read_filtered(part, part.log, part.tags or frozenset())
            except SluiceError as err:
                part.fail(err)
            except OSError as exc:
                part.fail(StorageError(f"reading {part.key[0]}/{part.key[1]} failed: {exc}"))

    def _check_range(self, part: PartitionRead, log: ReadableLog) -> int:
        start, end = log.log_start_offset, log.log_end_offset
        if not start <= part.position <= end:
            raise OffsetOutOfRange(
                f"offset {part.position} is out of range for {part.key[0]}/{part.key[1]} "
                f"(log start {start}, log end {end})"
            )
        # Offsets between the high watermark and the log end are in range, with nothing to read yet.
        return log.high_watermark

    def _limit(self, part: PartitionRead) -> int:
        pmax = part.spec.partition_max_bytes or self.caps.default_partition_max_bytes
        return min(pmax - part.out_bytes, self.room)

    def _read_plain(self, part: PartitionRead, log: ReadableLog) -> None:
        end = self._check_range(part, log)
        start = part.position
        # A log read may stop early (at a segment end), so keep reading while there is room.
        while part.position < end:
            limit = self._limit(part)
            min_one = self.total_bytes == 0
            if limit <= 0 and not min_one:
                part.full = True
                return
            try:
                chunk = log.read(part.position, max(limit, 0), min_one)
            except StorageError:
                if part.position != start:  # answer what was read before it; the next fetch meets it
                    return
                raise
            if not chunk.data:
                part.full = True  # the next batch does not fit
                return
            self._take(part, chunk.data, chunk.next_offset)

    def _read_filtered(self, part: PartitionRead, log: ReadableLog, tags: frozenset[str]) -> None:
        end = self._check_range(part, log)
        start = part.position
        while part.position < end:
            if part.scanned >= self.caps.scan_bytes:
                part.scan_budget_hit = True
                return
            limit = self._limit(part)
            min_one = self.total_bytes == 0
            if limit <= 0 and not min_one:
                part.full = True
                return
            budget = min(self.caps.scan_chunk_bytes, self.caps.scan_bytes - part.scanned)
            # min_one so a batch larger than the scan step is still walked.
            try:
                raw = log.read(part.position, budget, True)
            except StorageError:
                if part.position != start:  # as in _read_plain
                    return
                raise
            if not raw.data:
                return
            before = part.position
            # Imported on the first filtered read: filtering needs numpy (~16 MB of RSS), which a
            # broker whose consumers never filter never loads (docs/latency.md, "Memory").
            from sluice.broker.filtering import filter_chunk

            result = filter_chunk(raw.data, part.position, tags, max(limit, 0), min_one, part.sql)
            for batch in result.batches:
                part.batches.append(batch)
            part.out_bytes += result.out_bytes
            self.total_bytes += result.out_bytes
            part.position = result.next_offset
            part.scanned += len(raw.data)
            if result.stopped_on_limit:
                part.full = True
                return
            if part.position == before:
                return  # no progress possible (defensive: a well-formed log always advances)

    def _take(self, part: PartitionRead, data: bytes, next_offset: int) -> None:
        part.batches.append(data)
        part.out_bytes += len(data)
        self.total_bytes += len(data)
        part.position = next_offset

    # ---- completion -------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether the request should be answered now rather than parked."""
        if self.limits.max_wait_ms <= 0 or not (self.parts or self.others):
            return True
        if self.total_bytes >= self.limits.min_bytes or self.room <= 0:
            return True
        waiting = self.others > 0
        for part in self.parts:
            if part.error is not None or part.scan_budget_hit:
                return True
            if not self.parked and part.skipped_all:
                # A filtered scan skipped records and reached the end with nothing to keep: answer the
                # new position now (RocketMQ's NO_MATCHED_MSG) rather than after max_wait_ms, or a
                # filter that matches nothing in a backlog costs one long-poll per fetch. Once parked,
                # appends that do not match keep it waiting (one empty answer per append would not).
                return True
            if not part.full:
                waiting = True
        # Every partition is at its limit: waiting cannot add anything.
        return not waiting

    def waiting_keys(self) -> list[TopicPartitionKey]:
        """The partitions whose appends could still add to this answer."""
        return [p.key for p in self.parts if p.error is None and not p.full and p.log is not None]

    def finish(self) -> list[PartitionRead]:
        for part in self.parts:
            part.refresh_marks()
        return self.parts


def new_read(
    specs: Iterable[tuple[PartitionSpec, ReadableLog | None, SluiceError | None]],
    limits: FetchLimits,
    caps: FetchCaps,
    others: int = 0,
) -> FetchRead:
    """Build the read state from (spec, log or None, routing error or None) triples."""
    parts = [routed_partition(spec, log, error, caps) for spec, log, error in specs]
    return FetchRead(parts, limits, caps, others)


def routed_partition(
    spec: PartitionSpec, log: ReadableLog | None, error: SluiceError | None, caps: FetchCaps
) -> PartitionRead:
    """One partition's read state from its routing (its log, or the routing error)."""
    part = prepare_partition(spec, log, caps)
    if error is not None and part.error is None:
        part.fail(error)
    return part
