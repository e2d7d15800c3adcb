"""``consumer.reconsume_later(record)``: RocketMQ's retry for pull groups (docs/retry.md).

The record goes to the group's retry topic ``RETRY.<group>`` (one partition per delay level, so the
records of one partition come due roughly in append order), with headers naming its original
coordinates, the first failure, the reconsume count and its due time; past ``max_reconsume_times`` it
goes to ``DLQ.<group>`` instead. Then the original is marked processed and committed (asynchronously),
so its partition moves on.

The consumer subscribes to the retry topic itself (``retry=True``) and hands a retried record out only
when it is due: ``hold_not_due`` runs inside ``poll()``'s collect, on the consumer's lock. When the head
of a retry partition's chunk is not due, the records before it are handed out, the partition's position
is set to the head's offset (so no commit passes it) and the partition is paused; ``release_due`` resumes
it at the due time and the fetch starts again from the head. Other partitions are not held up. With
delayed delivery in the broker (``producer.send(deliver_after=...)``, another part of issue 17) the write
here would carry ``deliver_after`` and the hold would go: see docs/retry.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from sluice.client.consumer.prefetch import Chunk, Prefetcher
from sluice.client.consumer.retry_dedup import FetcherLike, ListOffsets, SourceIndex
from sluice.client.consumer.state import PartitionLifecycle, PartitionState, SubscriptionState
from sluice.codec.batch import Record
from sluice.errors import InvalidArgument, RecordNotOwned
from sluice.retry.levels import (
    H_COUNT,
    H_DUE,
    H_FIRST_FAILURE,
    H_LEVEL,
    H_OFFSET,
    H_PARTITION,
    H_SOURCE,
    H_TOPIC,
    DelayLevels,
    dlq_topic,
    retry_info,
    retry_topic,
    source_key,
)
from sluice.serde.records import raw_record

__all__ = ["Retrier", "RetryOutcome", "RetryPorts"]

log = logging.getLogger("sluice.consumer.retry")

TopicPartition = tuple[str, int]
_L = PartitionLifecycle


class _Future(Protocol):
    def result(self, timeout: float | None = None) -> object: ...


class _Producer(Protocol):
    def send(
        self,
        value: bytes,
        key: bytes | None = None,
        tag: str | None = None,
        headers: dict[str, bytes] | None = None,
        partition: int | None = None,
    ) -> _Future: ...

    def close(self, timeout: float | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class RetryPorts:
    """What the retrier uses of the Client (passed in: the consumer package may not import the Client)."""

    producer: Callable[[str], _Producer]
    list_offsets: ListOffsets
    fetcher: Callable[[Mapping[TopicPartition, int]], FetcherLike]
    partitions: Callable[[str], int]


@dataclass(frozen=True, slots=True)
class RetryOutcome:
    """Where ``reconsume_later`` sent the record."""

    topic: str
    partition: int
    level: int
    due_ms: int
    count: int
    dead_lettered: bool
    #: The target already held this source (a crash between the write and the commit): not written again.
    deduplicated: bool


class Retrier:
    """The retry side of one group consumer."""

    def __init__(
        self,
        group: str,
        levels: DelayLevels,
        max_reconsume_times: int,
        dedup_window: timedelta,
        ports: RetryPorts,
        timeout: float,
    ) -> None:
        self.topic = retry_topic(group)
        self.dlq = dlq_topic(group)
        self.levels = levels
        self.max_reconsume_times = max_reconsume_times
        self._ports = ports
        self._timeout = timeout
        self._index = SourceIndex(ports.list_offsets, ports.fetcher, H_SOURCE, dedup_window, timeout)
        self._producers: dict[str, _Producer] = {}
        self._write_lock = threading.Lock()
        #: Held retry partitions: {tp: due time in unix ms}.
        self.holds: dict[TopicPartition, int] = {}
        #: Fault injection for the crash tests: called after the retry write, before the commit.
        self.after_write: Callable[[], None] | None = None
        #: Partitions checked against the targets since they were assigned (skip_retried).
        self._checked: dict[TopicPartition, PartitionState] = {}

    # ---- holding records that are not due (poll's collect, on the consumer's lock) ----------------

    def hold_not_due(
        self, state: SubscriptionState, prefetch: Prefetcher, chunk: Chunk, part: PartitionState, room: int
    ) -> list[Record] | None:
        """None: every record ``poll()`` would take from ``chunk`` is due (take them as usual). Else the
        due records before the first one that is not, with the partition held at that one."""
        recs = chunk.as_records()
        stop = min(len(recs), chunk.start + room)
        now = int(time.time() * 1000)
        i = chunk.start
        due = 0
        while i < stop:
            headers = recs[i].headers
            raw = headers.get(H_DUE) if headers else None
            due = int(raw) if raw is not None and raw.isdigit() else 0
            if due > now:
                break
            i += 1
        else:
            return None
        taken = recs[chunk.start : i]
        offsets = [r.offset for r in taken] if state.in_flight_min else []
        state.handed_out(part, offsets, recs[i].offset)
        state.pause(part)
        prefetch.stop_fetching(chunk.tp)
        self.holds[chunk.tp] = due
        return taken

    def due_now(self, paused: Callable[[], frozenset[TopicPartition]]) -> list[TopicPartition]:
        """Held partitions whose head is due (forgotten here; the caller resumes them)."""
        if not self.holds:
            return []
        now = int(time.time() * 1000)
        held = paused()
        out = []
        for tp, due in list(self.holds.items()):
            if tp not in held:
                del self.holds[tp]  # revoked, or resumed by the application
            elif due <= now:
                del self.holds[tp]
                out.append(tp)
        return out

    def wait_bound(self, wait: float) -> float:
        """``wait`` cut to the next due time, so poll() wakes up for it."""
        if not self.holds:
            return wait
        nearest = min(self.holds.values()) / 1000.0 - time.time()
        return max(min(wait, nearest), 0.001)

    # ---- skipping records that were retried already -----------------------------------------

    def skip_retried(self, records: list[Record], state: SubscriptionState) -> list[Record]:
        """``records`` without those a retry or dead letter was written for already.

        That happens after a crash (or a lost membership) between the retry write and the commit of
        the original: the original comes again, to this member or another, while its retry is on its
        way. A newly assigned partition makes the retry and DLQ topics be read up to their end first;
        a record is looked up only when its offset is at most the highest source offset seen for its
        partition, so the usual record costs one dict lookup per chunk.
        """
        parts = state.parts
        # By PartitionState identity: a partition revoked and assigned again between two polls is a
        # new PartitionState, so it is checked again (another member may have held it meanwhile).
        fresh = {
            tp
            for tp in {(r.topic, r.partition) for r in records}
            if self._checked.get(tp) is not parts.get(tp)
        }
        if fresh:
            for tp in self._targets():
                self._index.catch_up(tp)
            for tp in fresh:
                part = parts.get(tp)
                if part is not None:
                    self._checked[tp] = part
            for tp in [tp for tp in self._checked if tp not in parts]:
                del self._checked[tp]
        top = self._index.max_source
        if not top:
            return records
        out: list[Record] = []
        for r in records:
            limit = top.get((r.topic, r.partition))
            if (
                limit is not None
                and r.offset <= limit
                and self._index.seen(source_key(r.topic, r.partition, r.offset))
            ):
                log.info("%s[%d] offset %d: retried already (skipped)", r.topic, r.partition, r.offset)
                if state.in_flight_min:
                    state.done((r.topic, r.partition), r.offset)
                continue
            out.append(r)
        return out

    def unchecked(self, state: SubscriptionState) -> bool:
        """Whether a held partition was assigned since it was last checked against the targets
        (the caller holds the consumer's lock)."""
        return any(self._checked.get(tp) is not part for tp, part in state.parts.items())

    def check_assigned(self, state: SubscriptionState, lock: threading.RLock) -> None:
        """Read the retry and DLQ topics up to their end for partitions assigned since their last
        check, before any of their records is taken: poll's prepare step does it, outside the lock
        (sluice.aio runs that step in a worker thread), so ``skip_retried`` finds them checked."""
        with lock:
            fresh = {tp: part for tp, part in state.parts.items() if self._checked.get(tp) is not part}
        if not fresh:
            return
        for tp in self._targets():
            self._index.catch_up(tp)
        with lock:
            for tp, part in fresh.items():
                if state.parts.get(tp) is part:
                    self._checked[tp] = part

    def _targets(self) -> list[TopicPartition]:
        return [(self.topic, p) for p in range(self._ports.partitions(self.topic))] + [(self.dlq, 0)]

    # ---- reconsume_later ------------------------------------------------------------------------

    def check_owned(self, state: SubscriptionState, record: Record) -> None:
        """RecordNotOwned unless poll() handed ``record`` out here and it is not finished."""
        if not isinstance(record, Record):
            raise InvalidArgument(f"reconsume_later takes a Record from poll(), got {type(record).__name__}")
        tp = (record.topic, record.partition)
        part = state.parts.get(tp)
        if part is None or part.lifecycle is _L.REVOKING:
            raise RecordNotOwned(
                f"{record.topic}[{record.partition}] offset {record.offset}: the partition is not assigned "
                "to this consumer (revoked, lost, or never assigned)"
            )
        if state.in_flight_min:
            if record.offset not in part.in_flight:
                raise RecordNotOwned(
                    f"{record.topic}[{record.partition}] offset {record.offset} is not in flight here "
                    "(not handed out by poll(), or done() already)"
                )
        elif not part.committed <= record.offset < part.position:
            raise RecordNotOwned(
                f"{record.topic}[{record.partition}] offset {record.offset} was not handed out by poll() "
                f"or is committed already (handed out: {max(part.committed, 0)}..{part.position - 1})"
            )

    def target(
        self, record: Record, delay_level: int | None, delay: timedelta | None
    ) -> tuple[str, int, int, int, int]:
        """(topic, partition, level, due_ms, count) of the retry of ``record``."""
        if delay_level is not None and delay is not None:
            raise InvalidArgument("give delay_level or delay, not both")
        info = retry_info(record.headers)
        count = (info.count if info is not None else 0) + 1
        now = int(time.time() * 1000)
        if delay_level is not None:
            level = self.levels.check(delay_level)
        if count > self.max_reconsume_times:
            return self.dlq, 0, 0, now, count
        if delay is not None:
            if not isinstance(delay, timedelta):
                raise InvalidArgument(f"delay must be a timedelta, got {type(delay).__name__}")
            # A delay in the past (negative) is due now, as a deliver_at in the past is.
            wait = max(delay, timedelta(0))
            level = self.levels.level_of_delay(wait)
        else:
            if delay_level is None:
                level = self.levels.level_for_retry(count)
            wait = self.levels.delay(level)
        partitions = self._ports.partitions(self.topic)
        return self.topic, (level - 1) % partitions, level, now + int(wait.total_seconds() * 1000), count

    def send(self, record: Record, delay_level: int | None, delay: timedelta | None) -> RetryOutcome:
        """Write the retry (or dead letter) of ``record`` unless its target holds it already."""
        record = raw_record(record)  # the bytes as stored, not what a deserializer made of them
        topic, partition, level, due, count = self.target(record, delay_level, delay)
        key = source_key(record.topic, record.partition, record.offset)
        tp = (topic, partition)
        with self._write_lock:
            if self._index.contains(tp, key):
                return RetryOutcome(topic, partition, level, due, count, topic == self.dlq, True)
            headers = dict(record.headers) if record.headers else {}
            info = retry_info(record.headers)
            if info is None:  # first failure: the original coordinates are the record's own
                headers[H_TOPIC] = record.topic.encode()
                headers[H_PARTITION] = str(record.partition).encode()
                headers[H_OFFSET] = str(record.offset).encode()
                headers[H_FIRST_FAILURE] = str(int(time.time() * 1000)).encode()
            headers[H_COUNT] = str(count).encode()
            headers[H_LEVEL] = str(level).encode()
            headers[H_DUE] = str(due).encode()
            headers[H_SOURCE] = key.encode()
            producer = self._producer(topic)
            producer.send(
                record.value, key=record.key, tag=record.tag, headers=headers, partition=partition
            ).result(self._timeout)
            self._index.add(tp, key)
        if self.after_write is not None:
            self.after_write()
        return RetryOutcome(topic, partition, level, due, count, topic == self.dlq, False)

    def _producer(self, topic: str) -> _Producer:
        producer = self._producers.get(topic)
        if producer is None:
            producer = self._producers[topic] = self._ports.producer(topic)
        return producer

    def close(self) -> None:
        for producer in self._producers.values():
            producer.close(self._timeout)
        self._producers.clear()


def resume_due(
    retrier: Retrier,
    paused: Callable[[], frozenset[TopicPartition]],
    resume: Callable[[Iterable[TopicPartition]], None],
) -> None:
    """Resume the held retry partitions whose head came due (poll(), before collecting)."""
    due = retrier.due_now(paused)
    if due:
        resume(due)
