"""The Producer: ``send()`` appends to a partition batch; a sender thread ships batches.

``send()`` is the hot path and does as little as possible: pick the partition
(``crc32(key) % partitions``, or the sticky partition for keyless records), append
to that partition's open :class:`~sluice.codec.batch.BatchBuilder` under one lock,
and return a :class:`FutureRecordMetadata` that points at the batch's shared
result. Encoding, requests, retries and completion happen in the sender thread.
"""

from __future__ import annotations

import threading
import time
import zlib
from bisect import bisect_right
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from itertools import accumulate
from types import TracebackType
from typing import Any

from sluice.client.links import BrokerLinks
from sluice.client.metadata import MetadataCache
from sluice.client.producer.accumulator import Accumulator, ProducerBatch
from sluice.client.producer.bulk import Columns, as_bytes, headers_size, prepare, split
from sluice.client.producer.config import ProducerConfig
from sluice.client.producer.delay import DelayedSender
from sluice.client.producer.futures import FutureRecordMetadata, FutureRecordsMetadata
from sluice.client.producer.idempotence import Idempotence, init_producer_id
from sluice.client.producer.partitioner import StickyPartitioner, make_partitioner
from sluice.client.producer.sender import Sender
from sluice.codec.batch import COLUMN_BYTES, HEADER_SIZE, Headers
from sluice.codec.batch.compression import codec_id
from sluice.codec.filter import parse_filter
from sluice.common.peers import Peers
from sluice.errors import (
    BatchTooLarge,
    InvalidArgument,
    RequestTimedOut,
    SluiceError,
    UnknownTopicOrPartition,
)
from sluice.serde.records import RecordSerializer
from sluice.serde.tracing import SendTracer

__all__ = ["Producer"]

_crc32 = zlib.crc32
_time_ns = time.time_ns
_new_future = object.__new__
_MAX_CACHED_TAGS = 10_000


class Producer:
    """Sends records to one topic. Create it with ``client.producer(topic, ...)``.

    Thread-safe: any number of threads may call ``send()``. Use it as a context
    manager, or call ``close()``, so buffered records are delivered.
    """

    def __init__(
        self,
        topic: str,
        config: ProducerConfig,
        channels: Peers,
        metadata: MetadataCache,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_close: Callable[[Producer], None] | None = None,
        links: BrokerLinks | None = None,
        client_id: str = "",
    ) -> None:
        md = metadata.get([topic])
        info = md.topic(topic)
        self.topic = topic
        self.config = config
        self._partitions = len(info.partitions)
        self._partitioner = make_partitioner(config.partitioner, self._partitions)
        self._acc = Accumulator(
            topic,
            self._partitions,
            self._partitioner,
            batch_size=config.batch_size,
            linger=config.linger.total_seconds(),
            delivery_timeout=config.delivery_timeout.total_seconds(),
            clock=clock,
            codec=codec_id(config.compression),
            # Pipelined only where sequence numbers keep the order (docs/producer.md, "Ordering").
            max_in_flight_batches=config.max_in_flight if config.idempotent else 1,
        )
        self._open = self._acc.open
        self._batch_size = config.batch_size
        self._send_at_once = config.linger.total_seconds() == 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._tags: set[str] = set()
        self._on_close = on_close
        #: key_serializer / value_serializer (docs/serializers.md); None: send() takes bytes.
        self._serialize = RecordSerializer.of(config.key_serializer, config.value_serializer)
        self._tracer = SendTracer(topic) if config.tracing else None
        if self._tracer is not None:  # docs/tracing.md: send() inside a span; the plain path stays untouched
            self.send = self._send_traced  # type: ignore[method-assign]
        leaders = [md.leader_address(topic, p) for p in range(self._partitions)]
        #: The client's links (one shared connection per broker); a producer made without one
        #: owns its own.
        self._own_links = links is None
        self._links = links if links is not None else BrokerLinks(channels, metadata)
        idempotence = None
        if config.idempotent:
            # One round trip to the coordinator, here rather than on the first send: a producer that cannot
            # get an id fails where it is made, with a typed error, instead of failing every record later.
            identity = init_producer_id(metadata, client_id, config.request_timeout.total_seconds())
            idempotence = Idempotence(identity, self._partitions)
        self._sender = Sender(
            topic,
            self._acc,
            self._cond,
            config,
            channels=channels,
            metadata=metadata,
            links=self._links,
            leaders=leaders,
            clock=clock,
            idempotence=idempotence,
            client_id=client_id,
        )
        self._sender.start()
        #: Sends with deliver_at/deliver_after go through the schedule topic (made at the first one).
        self._metadata = metadata
        # Its inner producer sends what send() serialized already: bytes, so no serializers of its own.
        raw_config = config.replace(key_serializer=None, value_serializer=None, tracing=False)
        self._delayed = DelayedSender(
            topic,
            self._partitions,
            config,
            lambda name: Producer(
                name, raw_config, channels, metadata, clock=clock, links=self._links, client_id=client_id
            ),
            self._retention_ms,
        )

    def _retention_ms(self, topic: str) -> int:
        return self._metadata.get([topic]).topic(topic).config.get("retention_ms", 0)

    @property
    def partitions(self) -> int:
        """The topic's partition count (fixed for the producer's life)."""
        return self._partitions

    def in_flight(self, partition: int) -> int:
        """Batches of ``partition`` sent and not answered yet: at most ``max_in_flight`` with idempotence,
        one run without (docs/producer.md, "Ordering")."""
        with self._lock:
            return len(self._acc.in_flight(partition))

    def may_block(self) -> bool:
        """Whether ``send()`` may block now (``buffer_memory`` is in use): sluice.aio then sends from a
        worker thread instead of blocking its event loop."""
        acc = self._acc
        limit = self.config.buffer_memory
        if acc.buffered + self._partitions * self._batch_size < limit:
            return False  # even with every partition's batch open: no walk over the open batches
        return acc.held() >= limit

    def send(
        self,
        value: bytes | bytearray | memoryview | Any,
        key: bytes | bytearray | memoryview | Any | None = None,
        tag: str | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        deliver_at: datetime | None = None,
        deliver_after: timedelta | None = None,
    ) -> FutureRecordMetadata:
        """Queue one record; returns a future of its :class:`RecordMetadata`.

        With ``deliver_at`` (a timezone-aware datetime) or ``deliver_after`` (a timedelta) the record
        is delivered to its partition when due (docs/delayed-delivery.md): until then it waits in the
        schedule topic, and the future's metadata is its place there. A due time in the past is
        delivered at once; one beyond ``config.max_delay`` raises DelayTooLong, one beyond the topic's
        retention DelayBeyondRetention.

        The partition is ``partition`` if given, else ``zlib.crc32(key) % partitions`` for
        a keyed record, else the sticky partition. ``timestamp`` defaults to now (ms).
        Blocks only when ``buffer_memory`` is exhausted (raising RequestTimedOut after
        ``max_block``). Raises BatchTooLarge for a record over ``max_request_size`` and
        InvalidArgument for bad arguments. With ``key_serializer`` / ``value_serializer`` the key and value
        are objects the serializers turn into bytes (SerializationError when they fail).
        """
        if value.__class__ is not bytes or self._serialize is not None:
            value, key = self._coerce(value, key)
        size = COLUMN_BYTES + len(value)
        if key is not None:
            if key.__class__ is not bytes:
                key = as_bytes(key, "key")
            size += len(key)
        if tag is not None:
            if tag not in self._tags:
                self._check_tag(tag)
            size += 2 + len(tag)
        if headers:
            size += headers_size(headers)
        if partition is None:
            sticky = key is None
            partition = self._partitioner.keyless() if key is None else _crc32(key) % self._partitions
        else:
            sticky = False
            if partition.__class__ is not int or not 0 <= partition < self._partitions:
                raise UnknownTopicOrPartition(
                    f"topic {self.topic!r} has no partition {partition!r} (it has {self._partitions})"
                )
        if deliver_at is not None or deliver_after is not None:
            # A keyless delayed record spreads over the partitions itself: the sticky partition moves
            # only when an immediate batch closes.
            target = None if sticky else partition
            return self._delayed.send(value, key, tag, headers, target, timestamp, deliver_at, deliver_after)
        if timestamp is None:
            timestamp = _time_ns() // 1_000_000
        elif timestamp.__class__ is not int or timestamp < 0:
            raise InvalidArgument(f"timestamp must be an int of ms >= 0, got {timestamp!r}")
        # acquire/release instead of `with`: half the cost on this path. close() closes
        # every open batch, so a closed producer always takes the slow path (and raises).
        lock = self._lock
        lock.acquire()
        try:
            batch = self._open[partition]
            rolled = False
            if batch is None or batch.builder.size + size > self._batch_size:  # type: ignore[union-attr]
                batch = self._new_batch(partition, size, sticky)
                rolled = True
            index = batch.builder.append(value, key, tag, headers, timestamp)  # type: ignore[union-attr]
        finally:
            lock.release()
        if rolled and self._send_at_once:
            # linger=0: the new batch goes out from this thread, now, instead of waking the
            # sender thread to send it (a thread wake-up per record).
            self._sender.send_ready()
        # FutureRecordMetadata(batch.result, index, timestamp) without the Python-level
        # __init__ call: ~100 ns less per record.
        future = _new_future(FutureRecordMetadata)
        future._result = batch.result
        future._index = index
        future._timestamp = timestamp
        return future

    def send_many(
        self,
        values: Sequence[Any],
        keys: Sequence[Any] | None = None,
        *,
        headers: Sequence[Headers | None] | None = None,
        tags: Sequence[str | None] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> FutureRecordsMetadata:
        """Queue many records in one call; returns one future for all of them (docs/producer.md,
        "Sending many records at once").

        ``values[i]`` goes with ``keys[i]``, ``headers[i]`` and ``tags[i]`` (each list as long as
        ``values``, or None). Partitions, ordering, idempotence, acks, ``buffer_memory`` and
        compression are send()'s: per partition the records are appended in the list's order, as
        consecutive send() calls would. The keyless records of one call go to one partition (the sticky
        one; the round-robin partitioner turns per record). ``partition``/``timestamp``: for every record.
        Raises what send() would for the first bad record (InvalidArgument, BatchTooLarge,
        UnknownTopicOrPartition, SerializationError) and then queues none of them.
        """
        if self._tracer is not None:  # a span per record: send() makes it
            none = [None] * len(values)
            columns = zip(values, keys or none, tags or none, headers or none, strict=True)
            sent = [self.send(v, k, t, h, partition, timestamp) for v, k, t, h in columns]
            return FutureRecordsMetadata([(f.batch, f._index, 1) for f in sent], None, 0)
        cols = prepare(values, keys, headers, tags, self._serialize, self._check_tag)
        largest = max(cols.sizes, default=0)
        if HEADER_SIZE + 2 + largest > self.config.max_request_size:
            raise BatchTooLarge(f"a record of about {largest} bytes exceeds max_request_size")
        if partition is None:
            sticky = isinstance(self._partitioner, StickyPartitioner)
            order, groups = split(cols, self._partitions, self._partitioner.keyless, sticky)
        elif partition.__class__ is not int or not 0 <= partition < self._partitions:
            raise UnknownTopicOrPartition(
                f"topic {self.topic!r} has no partition {partition!r} (it has {self._partitions})"
            )
        else:
            order, groups = None, [(partition, 0, len(cols.values))]
        if timestamp is None:
            timestamp = _time_ns() // 1_000_000
        elif timestamp.__class__ is not int or timestamp < 0:
            raise InvalidArgument(f"timestamp must be an int of ms >= 0, got {timestamp!r}")
        segments: list[tuple[Any, int, int]] = []
        rolled = False
        by_partition = cols if order is None else cols.pick(order)
        with self._lock:
            for p, start, end in groups:
                rolled = self._append_many(p, by_partition.cut(start, end), timestamp, segments) or rolled
        if rolled and self._send_at_once:
            self._sender.send_ready()
        return FutureRecordsMetadata(segments, order, timestamp)

    def _append_many(
        self, partition: int, cols: Columns, timestamp: int, segments: list[tuple[Any, int, int]]
    ) -> bool:
        """Append one partition's records of a send_many() (lock held), filling its open batch and as
        many new ones as they need; one segment per batch. Returns whether a batch was opened."""
        ends = list(accumulate(cols.sizes))
        n = len(ends)
        start = 0
        rolled = False
        batch_size = self._batch_size
        while start < n:
            before = ends[start - 1] if start else 0
            batch = self._open[partition]
            end = start
            if batch is not None:
                end = bisect_right(ends, before + batch_size - batch.builder.size, start)  # type: ignore[union-attr]
            if end == start:  # no room: a new batch, which takes at least one record (a large one alone)
                batch = self._new_batch(partition, cols.sizes[start], False)
                rolled = True
                room = batch_size - batch.builder.size  # type: ignore[union-attr]
                end = max(bisect_right(ends, before + room, start), start + 1)
            piece = cols.cut(start, end)
            first = batch.builder.extend(  # type: ignore[union-attr]
                piece.values, piece.keys, piece.value_lengths, piece.key_lengths,
                ends[end - 1] - before, timestamp, piece.headers, piece.pairs(), piece.tags,
            )  # fmt: skip
            segments.append((batch.result, first, end - start))  # type: ignore[union-attr]
            start = end
        return rolled

    def _send_traced(
        self,
        value: Any,
        key: Any = None,
        tag: str | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        deliver_at: datetime | None = None,
        deliver_after: timedelta | None = None,
    ) -> FutureRecordMetadata:
        """send() with ``tracing=True``: the same, inside a PRODUCER span whose context the headers carry."""
        assert self._tracer is not None
        future: FutureRecordMetadata = self._tracer.send(
            Producer.send.__get__(self),
            value,
            key,
            headers,
            tag=tag,
            partition=partition,
            timestamp=timestamp,
            deliver_at=deliver_at,
            deliver_after=deliver_after,
        )
        return future

    def _coerce(self, value: object, key: object) -> tuple[bytes, object]:
        """send()'s slow path for the value: serializers (which may change the key too), or a
        bytearray/memoryview to copy."""
        if self._serialize is not None:
            value, key = self._serialize(value, key)
        return (value if value.__class__ is bytes else as_bytes(value, "value")), key

    def _new_batch(self, partition: int, size: int, sticky: bool) -> ProducerBatch:
        """The slow path of send(): the open batch is full or missing (lock held)."""
        if self._closed:
            raise SluiceError("the producer is closed")
        if self._sender.failure is not None:
            raise SluiceError(f"the producer's sender thread failed: {self._sender.failure!r}")
        if HEADER_SIZE + 2 + size > self.config.max_request_size:
            raise BatchTooLarge(
                f"record of about {size} bytes exceeds max_request_size={self.config.max_request_size}"
            )
        acc = self._acc
        if self._open[partition] is not None:
            acc.close_open(partition)  # it has no room for this record
            if not self._send_at_once:
                self._cond.notify_all()
            if sticky:
                # The sticky partition moved on when its batch closed: follow it.
                partition = self._partitioner.keyless()
                batch = self._open[partition]
                if batch is not None and batch.builder.size + size <= self._batch_size:  # type: ignore[union-attr]
                    return batch
                acc.close_open(partition)
        if acc.held() >= self.config.buffer_memory:
            self._wait_for_space()
        batch = acc.roll(partition)
        if not self._send_at_once:
            # A new batch starts its linger clock: let the sender schedule it.
            self._cond.notify_all()
        return batch

    def _wait_for_space(self) -> None:
        acc = self._acc
        deadline = time.monotonic() + self.config.max_block.total_seconds()
        acc.waiting_for_space += 1
        try:
            self._cond.notify_all()
            while acc.held() >= self.config.buffer_memory:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RequestTimedOut(
                        f"send() blocked for max_block={self.config.max_block.total_seconds():g} s: "
                        f"buffer_memory={self.config.buffer_memory} bytes are all in use"
                    )
                if self._closed:
                    raise SluiceError("the producer is closed")
                self._cond.wait(remaining)
        finally:
            acc.waiting_for_space -= 1

    def _check_tag(self, tag: str) -> None:
        if not isinstance(tag, str):
            raise InvalidArgument(f"tag must be a str, got {type(tag).__name__}")
        try:
            ok = tag != "" and parse_filter(tag).tags == frozenset((tag,))
        except SluiceError:
            ok = False
        if not ok:
            raise InvalidArgument(
                f"invalid tag {tag!r}: use 1-255 characters from [A-Za-z0-9._:/-] "
                "(filters match tags exactly)"
            )
        if len(self._tags) >= _MAX_CACHED_TAGS:
            self._tags.clear()
        self._tags.add(tag)

    # ---- flush and close ---------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send every buffered record now and wait until each is acknowledged or failed.

        Does not raise the records' errors (their futures do); raises RequestTimedOut
        when ``timeout`` seconds pass first.
        """
        with self._cond:
            self._acc.flushing += 1
            delayed = self._delayed
            results = [b.result for b in self._acc.batches()]
            self._cond.notify_all()
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            delayed.flush(timeout)
            for r in results:
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
                if not r.wait(remaining):
                    raise RequestTimedOut(f"flush() did not complete within {timeout} s")
        finally:
            with self._cond:
                self._acc.flushing -= 1

    def flush_nowait(self) -> None:
        """``flush()`` without the wait: open batches pipeline behind those in flight (docs/producer.md)."""
        with self._cond:
            for p in range(self._partitions):
                self._acc.close_open(p)
            self._cond.notify_all()  # the sender thread ships them: the caller does not wait on a socket

    def close(self, timeout: float | None = None) -> None:
        """Stop accepting records, deliver the buffered ones and stop the sender.

        Waits up to ``timeout`` seconds (None: until every record is delivered or has
        failed by ``delivery_timeout``). Records still pending after the timeout fail
        with SluiceError. Idempotent.
        """
        self._delayed.close(timeout)
        with self._cond:
            self._closed = True
            self._acc.closing = True
            for p in range(self._partitions):
                self._acc.close_open(p)
            self._cond.notify_all()
        if not self._sender.join(timeout):
            with self._cond:
                self._sender.force_close = True
                self._cond.notify_all()
            self._sender.join(None)
        if self._own_links:
            self._links.close()
        if self._on_close is not None:
            self._on_close(self)
            self._on_close = None

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Producer topic={self.topic!r} partitions={self._partitions} closed={self._closed}>"
