"""Appending due records to their real topics exactly once, across crashes: recovery marks.

Every delivered record carries its schedule coordinates (``sluice-schedule: partition:offset``) and its
due time. The scheduler marks delivered records in the buckets' done files without an fsync per batch,
and keeps, durably, *recovery marks*: for each target partition it delivered to since the done files were
last made durable, an offset its records cannot land before (the end an earlier acknowledgement gave, or
the partition's high watermark when first met). A mark is written (fsynced) before the first record goes
to a partition not marked yet; every ``checkpoint`` the done files are fsynced and the marks cleared.

Batches are pipelined (``pipeline.py``): ``send`` does not wait, ``settle`` waits for one batch's answers
and ``settled`` takes its partitions' ends, in send order, so an end never passes a record of ours still in
flight; a partition with batches in flight keeps its mark through every checkpoint (``begin_checkpoint``).

After a crash (or a send whose outcome is unknown), ``recover`` reads each marked partition from its mark
to its end and returns every coordinate found there: those records were delivered whatever the done files
say, so they are never sent again, and the others are. A crash between the append and the progress
checkpoint therefore never duplicates, and this does not depend on a producer id (which dies with the
process) or on brokers keeping producer state; it costs one fsync per second and a scan of at most about a
second of each marked partition at recovery.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from pathlib import Path

from sluice.broker.schedule.entry import Entry
from sluice.client import Client, FutureRecordMetadata, Producer, ProducerConfig
from sluice.client.producer.delay import DUE_HEADER, SCHEDULE_HEADER
from sluice.errors import RequestTimedOut, SluiceError

__all__ = ["Deliverer", "Sent"]

log = logging.getLogger(__name__)

Target = tuple[str, int]
#: (schedule partition, schedule offset, due ms) of a delivered record.
Found = tuple[int, int, int]


def _found(headers: dict[str, bytes] | None) -> Found | None:
    if not headers:
        return None
    try:
        sp, so = headers[SCHEDULE_HEADER].split(b":")
        return int(sp), int(so), int(headers[DUE_HEADER])
    except (KeyError, ValueError):
        return None


class Sent:
    """One delivery batch sent: its records' futures, in the batch's order (``Deliverer.send``)."""

    __slots__ = ("batch", "error", "futures", "targets")

    def __init__(self, batch: list[Entry]) -> None:
        self.batch = batch
        self.futures: list[FutureRecordMetadata] = []
        #: Target partitions counted in flight for it (``Deliverer.forget`` uncounts them).
        self.targets: set[Target] = set()
        #: A failure while sending (the records queued before it may still land): raised by ``settle``.
        self.error: SluiceError | None = None


class Deliverer:
    def __init__(self, client: Client, data_dir: Path, config: ProducerConfig) -> None:
        self._client = client
        self._path = data_dir / "marks.json"
        self._config = config
        self._producers: dict[str, Producer] = {}
        #: Durable: target partition -> offset our not-yet-durably-done deliveries cannot precede.
        self._marks: dict[Target, int] = self._load()
        #: In memory: the checkpoint generation in which each mark was last used (``end_checkpoint``).
        self._used: dict[Target, int] = dict.fromkeys(self._marks, 0)
        self._generation = 0
        #: The marks file is written by the delivery loop (a new mark) and the checkpoint (clearing).
        self._marks_lock = threading.Lock()
        #: Serializes writes of the marks file, each of the marks as they are when it starts: the last
        #: write is never older than an earlier one. Held apart from ``_marks_lock``, so the delivery
        #: loop never waits for the checkpoint's fsync (only for its own, for a new partition).
        self._save_lock = threading.Lock()
        #: In memory: target partition -> the end after our last settled record there (``settle``, in send
        #: order: no record of ours in flight lands before it).
        self._ends: dict[Target, int] = {}
        #: In memory: target partition -> delivery batches sent there and not yet settled or forgotten.
        self._flying: dict[Target, int] = {}

    def _load(self) -> dict[Target, int]:
        try:
            doc = json.loads(self._path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return {(str(t), int(p)): int(o) for t, p, o in doc}

    def _save(self) -> None:  # _marks_lock not held
        with self._save_lock:
            with self._marks_lock:
                marks = list(self._marks.items())
            tmp = self._path.with_suffix(".tmp")
            with open(tmp, "w") as f:
                json.dump([[t, p, o] for (t, p), o in marks], f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._path)

    # ---- sending ---------------------------------------------------------------------------------

    def send(self, batch: list[Entry]) -> Sent:
        """Append ``batch`` to the target partitions, in order, without waiting for the answers (each
        partition's records go out behind its batches still in flight: ``Producer.flush_nowait``). A
        failure to send is kept in the answer, for ``settle`` to raise in its turn. Caller: the delivery
        loop, under the scheduler's batch lock (as ``settle``, ``prepare`` and the checkpoint)."""
        sent = Sent(batch)
        try:
            self._send(batch, sent)
        except SluiceError as exc:
            sent.error = exc
        return sent

    def _send(self, batch: list[Entry], sent: Sent) -> None:
        targets = {(e.topic, e.tp) for e in batch}
        sent.targets = targets
        with self._marks_lock:  # atomic with end_checkpoint's look at the marks
            for target in targets:  # in flight from here: the checkpoint keeps their marks
                self._flying[target] = self._flying.get(target, 0) + 1
            new = targets - self._marks.keys()
            for target in targets - new:
                self._used[target] = self._generation
        if new:
            # A partition not delivered to for a whole checkpoint period: its mark, durably, before
            # the first record goes (the checkpoint keeps busy partitions' marks, advanced, so this
            # fsync is off the due path except after idleness). A partition with batches in flight
            # always has its mark, so the end here is below every record of ours not yet done.
            ends = {}
            for target in new:
                end = self._ends.get(target)
                if end is None:
                    topic, tp = target
                    end = self._client.list_offsets(topic, "latest", [tp])[tp]
                    # Known from here: a later prepare() must not learn a higher end, past records of
                    # ours in flight, that a checkpoint would advance the mark to.
                    self._ends[target] = end
                ends[target] = end
            with self._marks_lock:
                self._marks.update(ends)
                self._used.update(dict.fromkeys(ends, self._generation))
            self._save()  # before the first record goes there
        futures = sent.futures
        producer: Producer | None = None
        for e in batch:
            if producer is None or producer.topic != e.topic:
                producer = self._producer(e.topic)
            # e.headers holds sluice-schedule already (entry.py builds it off the due path).
            futures.append(
                producer.send(
                    e.value, key=e.key, tag=e.tag, headers=e.headers, partition=e.tp, timestamp=e.timestamp
                )
            )
        # Each partition's batch goes now, whole (not its first records at the linger and the rest a
        # round trip later), and behind the partition's batches in flight rather than after their answers.
        for topic in {e.topic for e in batch}:
            self._producers[topic].flush_nowait()

    def settle(self, sent: Sent, timeout: float) -> None:
        """Wait for ``sent``'s acknowledgements (up to ``timeout`` seconds). Raises SluiceError when a
        record's outcome is unknown or failed: the batch stays in flight, and ``forget``, ``reset`` and
        ``recover`` decide what was delivered. Changes nothing (no lock needed): ``settled`` does."""
        if sent.error is not None:
            raise sent.error
        self._wait(sent, timeout)
        for result in {id(f.batch): f.batch for f in sent.futures}.values():
            if result.error is not None:
                raise result.error

    def settled(self, sent: Sent) -> None:
        """``sent`` is acknowledged (``settle`` returned): take its partitions' ends. Called in send order
        (an end taken here is never past a record of an earlier batch in flight), under the batch lock
        with the batch's done marks: a checkpoint sees both or neither."""
        ends = self._ends
        for e, f in zip(sent.batch, sent.futures, strict=True):
            end = f.result(0).offset + 1
            if end > ends.get((e.topic, e.tp), -1):
                ends[(e.topic, e.tp)] = end
        self.forget(sent)

    def wait(self, sent: Sent, timeout: float) -> None:
        """Until every record of ``sent`` is answered or failed (or ``timeout``): after a failure, so no
        request of the old producers is still on its way when recovery looks (it waits longer, too)."""
        with contextlib.suppress(SluiceError):
            self._wait(sent, timeout)

    @staticmethod
    def _wait(sent: Sent, timeout: float) -> None:
        """Raises RequestTimedOut when a record is not answered within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        for result in {id(f.batch): f.batch for f in sent.futures}.values():  # one per producer batch
            if not result.wait(max(0.0, deadline - time.monotonic())):
                raise RequestTimedOut(f"delivery not acknowledged within {timeout} s (it may still land)")

    def forget(self, sent: Sent) -> None:
        """``sent`` is no longer in flight (settled, or handed to recovery)."""
        with self._marks_lock:
            for target in sent.targets:
                left = self._flying.get(target, 0) - 1
                if left > 0:
                    self._flying[target] = left
                else:
                    self._flying.pop(target, None)
                # Its done marks are written in this checkpoint period: keep the mark through it.
                self._used[target] = self._generation
        sent.targets = set()

    def in_flight(self, target: Target) -> int:
        """Batches of ``target`` on the wire now, unanswered (the producer's count, up to its
        ``max_in_flight``): more than one while an answer is late is the pipeline at work."""
        producer = self._producers.get(target[0])
        return 0 if producer is None else producer.in_flight(target[1])

    def prepare(self, targets: set[Target]) -> None:
        """Before records for ``targets`` are due (called as their bucket is read in): open the topics'
        producers (an InitProducerId round trip each) and learn the partitions' ends, so the first due
        batch does not pay for them."""
        for topic in {t for t, _ in targets}:
            self._producer(topic)
        for topic, tp in targets - self._ends.keys():
            self._ends[(topic, tp)] = self._client.list_offsets(topic, "latest", [tp])[tp]

    def begin_checkpoint(self) -> tuple[int, dict[Target, int]]:
        """Called under the batch lock (no batch half settled): the done marks written so far cover every
        record below the partitions' ends now. Returns what ``end_checkpoint`` needs: the generation and
        those ends. A partition with batches in flight counts as used now, so its mark is advanced (to an
        end no record in flight precedes: settled in send order), never removed, while they fly."""
        generation = self._generation
        self._generation += 1
        with self._marks_lock:
            for target in self._flying:
                self._used[target] = generation
        return generation, dict(self._ends)

    def end_checkpoint(self, state: tuple[int, dict[Target, int]]) -> None:
        """The done marks of every delivery before ``begin_checkpoint`` are durable. A mark used in the
        last period is *advanced* to the partition's end at the checkpoint's start, which no later
        delivery can precede; one idle for a whole period is removed. Advancing instead of removing keeps
        the next batch to a busy partition from writing (and fsyncing) a new mark on the due path, while
        recovery still scans at most about a period per partition."""
        generation, ends = state
        changed = False
        with self._marks_lock:
            for t in list(self._marks):
                active = self._used.get(t, 0) >= generation
                if not active:
                    del self._marks[t]
                    changed = True
                elif ends.get(t, -1) > self._marks[t]:
                    self._marks[t] = ends[t]
                    changed = True
        if changed:
            # Until this lands the file holds the older (lower, or present) marks: still lower bounds.
            self._save()

    def _producer(self, topic: str) -> Producer:
        p = self._producers.get(topic)
        if p is None:
            p = self._producers[topic] = self._client.producer(topic, config=self._config)
        return p

    def reset(self) -> None:
        """After a failure: drop the producers (their state is unknown) and the ends they reported."""
        for p in self._producers.values():
            with contextlib.suppress(SluiceError):
                p.close(1.0)
        self._producers.clear()
        self._ends.clear()
        self._flying.clear()

    # ---- recovery --------------------------------------------------------------------------------

    def recover(self, timeout: float) -> list[Found]:
        """Every delivered record found in the marked partitions from their marks on. Raises SluiceError
        while the cluster cannot answer (the caller retries)."""
        found: list[Found] = []
        for (topic, tp), start in sorted(self._marks.items()):
            found += self._scan(topic, tp, start, timeout)
        if self._marks:
            log.info("schedule: recovery found %d delivered records after the marks", len(found))
        return found

    def _scan(self, topic: str, tp: int, start: int, timeout: float) -> list[Found]:
        end = self._client.list_offsets(topic, "latest", [tp])[tp]
        found: list[Found] = []
        deadline = time.monotonic() + timeout
        with self._client.fetcher({(topic, tp): start}, auto_offset_reset="earliest") as fetcher:
            position = start
            while position < end:
                if time.monotonic() > deadline:
                    raise SluiceError(f"schedule recovery: reading {topic}[{tp}] from {start} timed out")
                for r in fetcher.fetch(1.0):
                    position = max(position, r.offset + 1)
                    hit = _found(r.headers)
                    if hit is not None:
                        found.append(hit)
                position = max(position, fetcher.positions().get((topic, tp), position))
        self._ends[(topic, tp)] = max(end, self._ends.get((topic, tp), 0))
        return found

    def close(self, timeout: float) -> None:
        for p in self._producers.values():
            p.close(timeout)
        self._producers.clear()
