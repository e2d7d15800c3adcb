"""The workload every system gets, and the check that it delivered all of it exactly once.

A record is a 16-byte key that names its index (``k%015d``) and a 100-byte value that starts with
the producer's send time, read from CLOCK_MONOTONIC (``time.monotonic`` on Linux): the producer and
the consumer are separate processes, and this clock is the same for every process of the machine, so
the consumer's ``monotonic() - sent`` is the end-to-end latency.

``Feed`` is the producer's side (records, paced to a rate or as fast as the client takes them, and
the publish-ack latencies); ``Sink`` is the consumer's (which keys came, how often, and when).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

KEY_BYTES = 16
VALUE_BYTES = 100
STAMP = struct.Struct("<d")
_W = ord("w")
PADDING = b"v" * (VALUE_BYTES - STAMP.size)
#: The padding of a record sent in a paced run's warm-up: delivered and checked, not timed.
WARMUP_PADDING = b"w" * (VALUE_BYTES - STAMP.size)
#: A consumer stops this long after the producer finished and nothing new came (a lost record).
IDLE_AFTER_PRODUCER_S = 3.0
#: After the last expected record, a consumer keeps reading this long: a duplicate shows up there.
DUPLICATE_WATCH_S = 0.3


_KEY_FORMAT = b"k%015d"


def key_of(index: int) -> bytes:
    return _KEY_FORMAT % index


def index_of(key: bytes) -> int:
    """The record's index, or -1 for a key this workload never made."""
    if len(key) != KEY_BYTES or key[:1] != b"k" or not key[1:].isdigit():
        return -1
    return int(key[1:])


def value_at(sent: float, warmup: bool = False) -> bytes:
    return STAMP.pack(sent) + (WARMUP_PADDING if warmup else PADDING)


def is_warmup(value: bytes) -> bool:
    return value[STAMP.size : STAMP.size + 1] == b"w"


def sent_at(value: bytes) -> float:
    return float(STAMP.unpack_from(value)[0])


@dataclass
class Feed:
    """What a producer sends: ``n`` records, as fast as possible (``rate`` 0) or at ``rate`` per second.

    ``batch(limit)`` (``abatch`` from asyncio code) hands out the next records, at most ``limit``;
    paced, it waits until at least one is due and hands out those due, stamped with the time they
    are handed to the client. ``acked(sent, count)``: ``count`` records sent at ``sent`` were
    acknowledged now (the publish-ack latency).
    """

    n: int
    rate: float = 0.0
    next_index: int = 0
    started: float = 0.0
    finished: float = 0.0
    ack_latencies: list[float] = field(default_factory=list)
    #: The feed stops handing out records this long after the first (0: never), so a system that cannot
    #: keep up with a rate, or a slow one in a throughput run, ends its run in time; ``n`` becomes the
    #: count handed out (and the consumer expects exactly that many).
    max_seconds: float = 0.0
    #: Records handed out this long after the first are marked warm-up (not timed by the consumer).
    warmup_seconds: float = 0.0
    #: The process's CPU time when the first record was handed out: the CPU figure counts from there.
    started_cpu: float = 0.0

    @property
    def done(self) -> bool:
        return self.next_index >= self.n

    def _due(self, limit: int, now: float) -> int:
        if not self.started:
            self.started = now
            self.started_cpu = time.process_time()
        if self.max_seconds and now - self.started > self.max_seconds:
            self.n = self.next_index
            self.finished = now
            return 0
        if self.rate <= 0:
            return min(limit, self.n - self.next_index)
        due = int((now - self.started) * self.rate) + 1 - self.next_index
        return max(0, min(limit, due, self.n - self.next_index))

    def _take(self, count: int, now: float) -> tuple[list[bytes], list[bytes]]:
        """The next ``count`` records as (keys, values): the keys made by one C-level ``map``, not a
        Python step per record (the harness's own cost is in every system's figure)."""
        value = value_at(now, now - self.started < self.warmup_seconds)
        first = self.next_index
        self.next_index += count
        if self.next_index >= self.n:
            self.finished = now
        return list(map(_KEY_FORMAT.__mod__, range(first, first + count))), [value] * count

    def _wait(self) -> float:
        """Seconds until the next record is due (paced feeds)."""
        return self.started + self.next_index / self.rate - time.monotonic()

    def batch(self, limit: int) -> list[tuple[bytes, bytes]]:
        return list(zip(*self.columns(limit), strict=True))

    def columns(self, limit: int) -> tuple[list[bytes], list[bytes]]:
        """``batch`` as (keys, values), for clients that send columns (Sluice's ``send_many``)."""
        while True:
            now = time.monotonic()
            count = self._due(limit, now)
            if count or self.done:
                return self._take(count, now)
            time.sleep(max(0.0, self._wait()))

    async def abatch(self, limit: int) -> list[tuple[bytes, bytes]]:
        while True:
            now = time.monotonic()
            count = self._due(limit, now)
            if count or self.done:
                return list(zip(*self._take(count, now), strict=True))
            await asyncio.sleep(max(0.0, self._wait()))

    def acked(self, sent: float, count: int = 1) -> None:
        latency = time.monotonic() - sent
        self.ack_latencies.extend([latency] * count)


@dataclass
class Sink:
    """What a consumer received: every key counted, duplicates and strangers too, with latencies.

    ``finished()`` says when to stop reading: every record came (and ``DUPLICATE_WATCH_S`` passed
    without a new one), or the producer is done and nothing came for ``IDLE_AFTER_PRODUCER_S``.
    """

    n: int
    producer_done: object  # a multiprocessing Event (is_set())
    #: How many records the producer handed out (a multiprocessing Value, set before producer_done).
    sent_total: object = None
    #: Set at the first ``finished()`` call: the consumer is connected and subscribed, the producer may start.
    ready: object = None  # a multiprocessing Event (set()), or None
    keep_latency: bool = True
    seen: bytearray = field(init=False)
    received: int = 0
    distinct: int = 0
    duplicates: int = 0
    unexpected: int = 0
    first_at: float = 0.0
    #: The process's CPU time when the first record came: the CPU figure counts from there (imports,
    #: connecting and subscribing are not per-record work).
    first_cpu: float = 0.0
    complete_at: float = 0.0
    last_at: float = 0.0
    latencies: list[float] = field(default_factory=list)
    #: When the consumer first saw the producer done: the idle time counts from there or the last record.
    idle_mark: float = 0.0

    def __post_init__(self) -> None:
        self.seen = bytearray(self.n)

    def add(self, key: bytes, value: bytes) -> None:
        now = time.monotonic()
        index = index_of(key)
        if self.keep_latency and not is_warmup(value):
            self.latencies.append(now - sent_at(value))
        self.received += 1
        if not self.first_at:
            self.first_at = now
            self.first_cpu = time.process_time()
        self.last_at = now
        if not 0 <= index < self.n:
            self.unexpected += 1
        elif self.seen[index]:
            self.duplicates += 1
        else:
            self.seen[index] = 1
            self.distinct += 1
            if self.distinct == self.n:
                self.complete_at = now

    def add_many(self, keys: list[bytes], values: list[bytes]) -> None:
        """``add`` of each record, with the same checks and counts, done by C-level operations over
        the whole batch (joined keys and values, ``map``), not a Python step per record. Anything
        unusual in the batch (a key this workload never made, a value of another size, an index out of
        range) takes ``add`` record by record instead, so the counts stay exact."""
        n = len(keys)
        if not n:
            return
        indexes = _indexes(keys)
        if indexes is None or len(values) != n or min(indexes) < 0 or max(indexes) >= self.n:
            self._add_each(keys, values)
            return
        vals = b"".join(values)
        if len(vals) != VALUE_BYTES * n or set(map(len, values)) != {VALUE_BYTES}:
            self._add_each(keys, values)
            return
        now = time.monotonic()
        if self.keep_latency:
            # Each value's first 8 bytes are its send time, its 9th says whether it is a warm-up one.
            sent: Sequence[float] = _stamps(n).unpack(vals)
            warm = vals[STAMP.size :: VALUE_BYTES]
            if b"w" in warm:
                sent = [t for t, w in zip(sent, warm, strict=True) if w != _W]
            self.latencies += map(now.__sub__, sent)
        self.received += n
        if not self.first_at:
            self.first_at = now
            self.first_cpu = time.process_time()
        self.last_at = now
        seen = self.seen
        unique = set(indexes)
        new = len(unique) - sum(map(seen.__getitem__, unique))
        self.duplicates += n - new
        collections.deque(map(seen.__setitem__, unique, itertools.repeat(1)), maxlen=0)
        self.distinct += new
        if new and self.distinct == self.n:
            self.complete_at = now

    def _add_each(self, keys: list[bytes], values: list[bytes]) -> None:
        for key, value in zip(keys, values, strict=True):
            self.add(key or b"", value)  # a record without a key counts as unexpected

    def expected(self) -> int:
        """n, or fewer once the producer is done and handed out fewer (a paced run cut short)."""
        if self.sent_total is not None and self.producer_done.is_set():  # type: ignore[attr-defined]
            return min(self.n, int(self.sent_total.value))  # type: ignore[attr-defined]
        return self.n

    def finished(self) -> bool:
        if self.ready is not None:
            self.ready.set()  # type: ignore[attr-defined]
            self.ready = None
        now = time.monotonic()
        if not self.complete_at and self.last_at and self.distinct == self.expected():
            self.complete_at = self.last_at
        if self.complete_at:
            return now - max(self.complete_at, self.last_at) >= DUPLICATE_WATCH_S
        if not self.producer_done.is_set():  # type: ignore[attr-defined]
            return False
        self.idle_mark = self.idle_mark or now
        return now - max(self.last_at, self.idle_mark) >= IDLE_AFTER_PRODUCER_S

    def missing(self) -> int:
        return self.expected() - sum(self.seen[: self.expected()])

    def first_missing(self, limit: int = 5) -> list[int]:
        return [i for i, got in enumerate(self.seen[: self.expected()]) if not got][:limit]


@functools.lru_cache(maxsize=64)
def _stamps(n: int) -> struct.Struct:
    """``n`` joined values as their send times, read in one C call (each value: a stamp, then padding)."""
    return struct.Struct("<" + f"d{VALUE_BYTES - STAMP.size}x" * n)


def _indexes(keys: list[bytes]) -> list[int] | None:
    """Every key's index (``index_of``) in C-level passes, or None when one is not a key this workload
    makes (then ``index_of`` decides, key by key)."""
    if set(map(type, keys)) != {bytes}:
        return None
    joined = b"".join(keys)
    n = len(keys)
    if len(joined) != KEY_BYTES * n or joined[::KEY_BYTES].count(b"k") != n or joined.count(b"k") != n:
        return None
    if not joined.replace(b"k", b"").isdigit():
        return None
    # Every key is "k" and 15 digits (checked above): splitting at the k's gives the digits.
    return list(map(int, joined.replace(b"k", b" ").split()))


def percentile(values: list[float], p: float) -> float:
    """The p-quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]
