"""The load of a chaos run: one SDK producer (acks=all, idempotent unless told otherwise) sending numbered
records to every partition of a topic at a steady rate, what it saw (acknowledgements, failures, retries
with their errors), and the check of what a consumer reads back against what was acknowledged.

Retries are counted from the producer's own log (``sluice.producer``: "retrying <batch> ... after
<error>"), so the count is what the SDK did, not a guess from outside.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sluice.client import Client
from sluice.client.producer import Producer
from sluice.client.producer.futures import FutureRecordMetadata


class RetryLog(logging.Handler):
    """Every retry the producer logged: (monotonic time, error type)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.retries: list[tuple[float, str]] = []
        self._logger = logging.getLogger("sluice.producer")
        self._level = self._logger.level

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("retrying") and isinstance(record.args, tuple) and len(record.args) == 3:
            self.retries.append((time.monotonic(), type(record.args[2]).__name__))

    def between(self, start: float, end: float) -> Counter[str]:
        return Counter(kind for at, kind in list(self.retries) if start <= at <= end)

    def __enter__(self) -> RetryLog:
        self._logger.addHandler(self)
        self._logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


@dataclass
class Load:
    """Sends ``<partition>:<seq>`` records round-robin over the partitions at ``rate`` records/s."""

    bootstrap: str
    topic: str
    partitions: int
    rate: float
    idempotent: bool = True
    producer_config: dict[str, Any] = field(default_factory=dict)
    #: Bytes appended to every value (after ``<partition>:<seq>:``): with a small ``batch_size`` each
    #: record fills a batch, so batches are full and pipeline (the producer holds partial ones back).
    value_padding: int = 0
    sent: list[int] = field(init=False)
    #: Per partition: the sequence numbers acknowledged, and when each answer came (monotonic).
    acked: list[set[int]] = field(init=False)
    ack_times: list[list[float]] = field(init=False)
    failed: Counter[str] = field(init=False, default_factory=Counter)
    _pending: int = field(init=False, default=0)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _stop: threading.Event = field(init=False, default_factory=threading.Event)
    _thread: threading.Thread | None = field(init=False, default=None)
    error: BaseException | None = field(init=False, default=None)
    #: The SDK producer, once made (a test reads its batches in flight to time a kill).
    producer: Producer | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.sent = [0] * self.partitions
        self.acked = [set() for _ in range(self.partitions)]
        self.ack_times = [[] for _ in range(self.partitions)]

    @property
    def in_flight(self) -> int:
        """Records sent and not answered yet."""
        with self._lock:
            return self._pending

    def acked_count(self) -> int:
        with self._lock:
            return sum(len(a) for a in self.acked)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos-load", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 120) -> None:
        """Stop sending, then wait for every answer (the producer's flush and close)."""
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError("the load producer did not finish")
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        config = {
            "enable_idempotence": self.idempotent,
            # Retries are bounded by the delivery timeout (Kafka's default since 2.1): a failover
            # takes a session timeout, longer than a few doubling backoffs.
            "retries": 1_000,
            "retry_backoff_max": "1s",
            "linger": "5ms",
            **self.producer_config,
        }
        try:
            with Client(self.bootstrap) as client:
                producer = self.producer = client.producer(self.topic, **config)
                interval = 1 / self.rate
                next_at = time.monotonic()
                i = 0
                while not self._stop.is_set():
                    partition = i % self.partitions
                    seq = self.sent[partition]
                    self.sent[partition] = seq + 1
                    with self._lock:
                        self._pending += 1
                    value = f"{partition}:{seq}".encode()
                    if self.value_padding:
                        value += b":" + b"p" * self.value_padding
                    future = producer.send(value, partition=partition)
                    future.add_done_callback(functools.partial(self._answered, partition=partition, seq=seq))
                    i += 1
                    next_at += interval
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    elif delay < -1:  # fell behind (the producer blocked): do not burst to catch up
                        next_at = time.monotonic()
                producer.flush()
                producer.close()
        except BaseException as exc:
            self.error = exc

    def _answered(self, future: FutureRecordMetadata, *, partition: int, seq: int) -> None:
        error = future.exception(0)
        with self._lock:
            self._pending -= 1
            if error is None:
                self.acked[partition].add(seq)
                self.ack_times[partition].append(time.monotonic())
            else:
                self.failed[type(error).__name__] += 1

    def longest_stall(self, partition: int, start: float, end: float) -> float:
        """The longest time between two acknowledgements of ``partition`` around [start, end]."""
        with self._lock:
            times = sorted(self.ack_times[partition])
        before = [t for t in times if t <= start]
        window = ([before[-1]] if before else []) + [t for t in times if start < t]
        gaps = [b - a for a, b in itertools.pairwise(window) if a <= end]
        return max(gaps, default=0.0)


@dataclass
class Verdict:
    """What a consumer read back, against what the producer was told."""

    acked: int = 0
    consumed: int = 0
    lost: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    gaps: int = 0
    unacked_written: int = 0
    #: Runs of duplicated sequence numbers: (partition, first seq, how many), for telling a few lost
    #: answers from one large retried run.
    duplicate_runs: list[tuple[int, int, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def verify(load: Load, read: list[list[bytes]]) -> Verdict:
    """``read``: every record value of each partition, in log order.

    - lost: acknowledged and not read;
    - duplicates: read more than once;
    - out_of_order: a record read after one sent later (first occurrences only);
    - gaps: a sequence number missing below the highest read (acknowledged or not: an idempotent
      producer never leaves one behind a later acknowledged record);
    - unacked_written: read though never acknowledged (a failed send that landed: allowed, counted).
    """
    v = Verdict()
    for partition, values in enumerate(read):
        seqs = [int(value.split(b":")[1]) for value in values]
        assert all(value.startswith(f"{partition}:".encode()) for value in values), "wrong partition"
        counts = Counter(seqs)
        acked = load.acked[partition]
        v.acked += len(acked)
        v.consumed += len(seqs)
        v.duplicates += sum(c - 1 for c in counts.values())
        for seq in sorted(s for s, c in counts.items() if c > 1):
            run = v.duplicate_runs[-1] if v.duplicate_runs else None
            if run is not None and run[0] == partition and run[1] + run[2] == seq:
                v.duplicate_runs[-1] = (partition, run[1], run[2] + 1)
            else:
                v.duplicate_runs.append((partition, seq, 1))
        v.lost += len(acked - counts.keys())
        v.unacked_written += len(counts.keys() - acked)
        first_seen: list[int] = []
        seen: set[int] = set()
        for s in seqs:
            if s not in seen:
                seen.add(s)
                first_seen.append(s)
        v.out_of_order += sum(1 for a, b in itertools.pairwise(first_seen) if b < a)
        if seen:
            v.gaps += max(seen) + 1 - len(seen)
    return v
