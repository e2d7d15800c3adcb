"""The scheduler: reads the schedule topic into time buckets and appends each record to its topic when due.

Threads, sharing one lock. The reader follows every partition of ``__sluice_schedule`` from the read
checkpoint, appends each record to its bucket file (``buckets.py``; near ones also join the in-memory
timeline, ``timeline.py``) and, every ``checkpoint_interval``, fsyncs the buckets and then saves the read
positions. The delivery loop sleeps until the first record is due (or a new earlier one arrives) and sends
the due batch through the recovery marks (``delivery.py``), without waiting for the answers while the
window has room (``pipeline.py``); the acknowledgement thread settles the batches in the order they were
sent and marks them done. docs/delayed-delivery.md."""

from __future__ import annotations

import bisect
import gc
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from sluice.broker.schedule import metrics
from sluice.broker.schedule.buckets import BucketStore
from sluice.broker.schedule.delivery import Deliverer
from sluice.broker.schedule.entry import Entry, entry_of
from sluice.broker.schedule.pipeline import Flight, Window
from sluice.broker.schedule.timeline import Loaded, Timeline
from sluice.broker.schedule.trace import trace
from sluice.client import Client, ProducerConfig
from sluice.client.producer.delay import SCHEDULE_TOPIC
from sluice.errors import SluiceError

__all__ = ["Scheduler", "SchedulerSettings"]

log = logging.getLogger(__name__)

#: The delivery producers: acks=all (a delivered record is stored like any), idempotent (a retry inside
#: one process neither duplicates nor reorders, and up to ``max_in_flight`` batches per partition fly at
#: once in sequence order: what makes the pipelined deliveries safe for order). A long linger, because
#: every due batch ends with a flush_nowait() that sends it at once: with the 1 ms linger it had, the
#: sender shipped the first records a partition got while the loop was still appending the rest, which
#: then went a round trip later, so a large due batch took two round trips, not one.
_DELIVERY_CONFIG = ProducerConfig(
    acks=-1,
    linger=timedelta(seconds=1),
    enable_idempotence=True,
    max_in_flight=5,
    request_timeout=timedelta(seconds=10),
    delivery_timeout=timedelta(seconds=30),
)


@dataclass(frozen=True)
class SchedulerSettings:
    #: Width of a time bucket (one file each).
    bucket_ms: int = 10_000
    #: How long before a bucket starts it is read into memory.
    preload_ms: int = 2_000
    #: At most this many records per delivery batch.
    batch_limit: int = 2_000
    #: How often the read positions are made durable.
    checkpoint_interval: float = 0.2
    #: How often the reader makes the bucket files durable and saves its positions (a crash re-reads
    #: at most this much of the schedule topic; records spread over days touch a few hundred files).
    read_checkpoint_interval: float = 1.0
    #: How long one delivery batch may take before it counts as failed (then recovered).
    send_timeout: float = 60.0
    #: Delivery batches in flight at most (sent, not yet acknowledged): the pipeline (``pipeline.py``).
    window_batches: int = 32
    #: Records in flight at most (one second at 10,000 due/s).
    window_records: int = 10_000
    #: While a batch is in flight, the next is sent once the first waiting record is this late.
    spacing_ms: int = 10
    #: Tests only: exit (as kill -9 would) once this many records were appended to their topics and
    #: before their done marks: the window the recovery marks exist for. 0: never.
    crash_after: int = 0


def _yield_gil() -> None:
    time.sleep(0)


#: The most the preload lead grows to (memory: this many ms of due records more in memory).
_MAX_LEAD_MS = 20_000


class Scheduler:
    def __init__(
        self,
        client: Client,
        data_dir: Path,
        settings: SchedulerSettings,
        clock: Callable[[], int],
    ) -> None:
        self._client = client
        self._dir = data_dir
        self._settings = settings
        self._clock = clock
        data_dir.mkdir(parents=True, exist_ok=True)
        self._store = BucketStore(data_dir / "buckets", settings.bucket_ms)
        self._timeline = Timeline(self._store, settings.preload_ms)
        self._deliverer = Deliverer(client, data_dir, _DELIVERY_CONFIG)
        self._window = Window(settings.window_batches, settings.window_records, settings.spacing_ms)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        #: Guards the bucket files' handles (the reader appends and syncs; the delivery side marks done
        #: and deletes), apart from the timeline's lock so an fsync never holds up a due record.
        self._store_lock = threading.Lock()
        #: Held by the delivery loop from a batch's send to its done marks: the delivery checkpoint takes
        #: it to see no batch half done.
        self._batch_lock = threading.Lock()
        self._stop = threading.Event()
        self._checkpoint = data_dir / "checkpoint.json"
        self._read: dict[int, int] = self._load_checkpoint()
        self._durable_read = dict(self._read)
        self._threads: list[threading.Thread] = []
        #: How fast bucket files are read in lately (bytes/s; starts low, so the first big bucket is read
        #: early rather than late).
        self._load_bytes_per_s = 2e6
        #: Delivered records and the worst batch lateness (ms), for the log line.
        self.delivered = 0
        self.max_late_ms = 0

    def _load_checkpoint(self) -> dict[int, int]:
        try:
            doc = json.loads(self._checkpoint.read_text())
        except FileNotFoundError:
            return {}
        return {int(p): int(o) for p, o in doc["read"].items()}

    def _save_checkpoint(self) -> None:
        tmp = self._checkpoint.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"read": {str(p): o for p, o in self._read.items()}}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._checkpoint)

    # ---- life ---------------------------------------------------------------------------------------

    def start(self) -> None:
        self._recover_marks()
        metrics.PENDING.set(self._store.count_pending())
        metrics.IN_MEMORY.set_function(lambda: self._timeline.size)
        metrics.OVERDUE.set_function(self._overdue_seconds)
        self._store.split_due(self._clock())
        with self._lock:
            self._timeline.advance(self._clock())
        for name, target in (
            ("schedule-read", self._read_loop),
            ("schedule-deliver", self._deliver_loop),
            ("schedule-ack", self._ack_loop),
            ("schedule-checkpoint", self._checkpoint_loop),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for t in self._threads:
            t.join(30)
        self._checkpoint_delivery()
        with self._store_lock:
            self._store.close()
        self._save_checkpoint()
        self._deliverer.close(5.0)

    def pending_in_memory(self) -> int:
        return self._timeline.size

    def alive(self) -> bool:
        """Started, not stopping, and every thread running (the /healthz answer)."""
        return bool(self._threads) and not self._stop.is_set() and all(t.is_alive() for t in self._threads)

    def _overdue_seconds(self) -> float:
        # Read without the lock: a scrape must never wait for the delivery loop (Timeline.first).
        due = self._timeline.next_due()
        if due is None:
            return 0.0
        return max(0, self._clock() - due) / 1000

    # ---- reading the schedule topic --------------------------------------------------------------

    def _read_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._follow()
            except SluiceError as exc:
                metrics.ERRORS.labels("read").inc()
                log.warning("schedule: reading %s failed (%s); retrying", SCHEDULE_TOPIC, exc)
                self._stop.wait(0.5)

    def _follow(self) -> None:
        md = self._client.metadata([SCHEDULE_TOPIC], refresh=True)
        partitions = len(md.topic(SCHEDULE_TOPIC).partitions)
        positions = {(SCHEDULE_TOPIC, p): self._read.get(p, 0) for p in range(partitions)}
        last_sync = time.monotonic()
        with self._client.fetcher(positions, auto_offset_reset="earliest", max_wait_ms=100) as fetcher:
            while not self._stop.is_set():
                records = fetcher.fetch()
                entries: list[Entry] = []
                for r in records:
                    e = entry_of(r)
                    if e is None:
                        log.warning(
                            "schedule: %s[%d]@%d has no envelope: skipped", r.topic, r.partition, r.offset
                        )
                    else:
                        entries.append(e)
                if entries:
                    with self._store_lock:
                        self._store.append(entries, self._clock())
                    metrics.READ.inc(len(entries))
                    metrics.PENDING.inc(len(entries))
                    with self._cond:
                        if self._timeline.add(entries):
                            self._cond.notify_all()
                for r in records:
                    self._read[r.partition] = max(self._read.get(r.partition, 0), r.offset + 1)
                self._preload()
                if time.monotonic() - last_sync >= self._settings.read_checkpoint_interval:
                    # Buckets durable first, then the positions past them.
                    with self._store_lock:
                        self._store.sync()
                    self._save_checkpoint()
                    with self._cond:
                        self._durable_read = dict(self._read)
                    last_sync = time.monotonic()

    def _preload(self) -> None:
        """Read the buckets about to start into memory: here, on the reader's thread, so the delivery
        loop never stops to decode a bucket; the lock is held only to install it (O(1), timeline.py)."""
        now = self._clock()
        with self._store_lock:
            self._store.split_due(now)
            lead = self._lead_ms(now)
        with self._cond:
            self._timeline.lead_ms = lead
            plan = self._timeline.plan(now)
        if plan:
            # No cyclic collection while the buckets are read in (they are frozen below): a full one walks
            # every record being built, in one C call that holds the GIL, so the delivery thread waits.
            gc.disable()
        try:
            self._load_planned(plan)
        finally:
            if plan:
                # The loaded records live until due: keep the cyclic GC from walking them again and again
                # (a full collection over a few 100,000 of them stalls delivery for 100 ms and more).
                gc.freeze()
                gc.enable()
        with self._cond:
            self._timeline.planned(now)

    def _load_planned(self, plan: list[int]) -> None:
        for bucket in plan:
            started = time.monotonic()
            trace("load_start", bucket=bucket)
            entries, done = self._store.load(bucket, _yield_gil)
            loaded = Loaded.of(entries, done)
            self._learn_load_time(self._store.size(bucket), time.monotonic() - started)
            targets = {(e.topic, e.tp) for e in entries}
            if targets:
                try:
                    with self._batch_lock:
                        self._deliverer.prepare(targets)
                except SluiceError as exc:  # the delivery loop meets it again, and recovers
                    metrics.ERRORS.labels("prepare").inc()
                    log.warning("schedule: preparing deliveries failed (%s)", exc)
            with self._cond:
                self._timeline.install(bucket, loaded)
                self._cond.notify_all()
            trace(
                "load_end", bucket=bucket, records=len(entries), seconds=round(time.monotonic() - started, 3)
            )

    def _learn_load_time(self, size: int, seconds: float) -> None:
        if size >= 1 << 16 and seconds > 0:  # small reads say little about the speed
            self._load_bytes_per_s = 0.5 * self._load_bytes_per_s + 0.5 * size / seconds

    def _lead_ms(self, now: int) -> int:
        """How much earlier than ``preload_ms`` to start reading the coming buckets: twice the time the
        largest of them takes to read at the speed reads had lately, capped. A bucket of 100,000 records
        took over 2 s to read on the loaded test machine, longer than the 2 s preload, so its first
        records were due before they were in memory (the whole 10,000 due/s run started 2 s late)."""
        first = self._store.bucket_of(now)
        last = self._store.bucket_of(now + self._settings.preload_ms + _MAX_LEAD_MS)
        ids = self._store.ids  # sorted: the few coming buckets, not every bucket file (once per fetch)
        coming = ids[bisect.bisect_left(ids, first) : bisect.bisect_right(ids, last)]
        size = max((self._store.size(b) for b in coming), default=0)
        return min(_MAX_LEAD_MS, int(2000 * size / self._load_bytes_per_s))

    # ---- delivering ---------------------------------------------------------------------------------

    def _deliver_loop(self) -> None:
        """Pop the due records (up to ``batch_limit``) and send them, without waiting for the answers
        while the window has room (``pipeline.py``); the acknowledgement thread settles them in order."""
        window = self._window
        while not self._stop.is_set():
            with self._cond:
                now = self._clock()
                due = self._timeline.next_due()
                if due is None or due > now:
                    # Sleep until the first record is due, or until the reader brings an earlier one
                    # or a bucket (it notifies): a timer, not a poll. The caps only bound how long a
                    # step of the wall clock (or of the tests' clock offset) can go unnoticed.
                    self._cond.wait(1.0 if due is None else min(0.25, (due - now) / 1000))
                    continue
                gate = window.gate(now, due)
                if gate != 0:  # a batch in flight, not late yet (an answer wakes us), or no room
                    self._cond.wait(0.25 if gate is None else gate / 1000)
                    continue
                batch = self._timeline.pop_due(now, min(self._settings.batch_limit, window.room()))
            if batch:
                self._send(batch, now)

    def _send(self, batch: list[Entry], popped: int) -> None:
        with self._batch_lock:  # the checkpoint sees a batch sent (counted in flight) or not at all
            locked = self._clock()
            metrics.DUE.inc(len(batch))
            sent = self._deliverer.send(batch)
            flight = Flight(sent, popped, locked, self._clock())
            with self._cond:
                self._window.push(flight)
                if sent.error is not None:
                    self._window.broken = True  # nothing more until the recovery of this one
                self._cond.notify_all()

    def _ack_loop(self) -> None:
        """Settle the batches in flight in the order they were sent: wait for the oldest one's
        acknowledgements, then write its done marks. A failure sends every batch in flight to recovery.
        At stop, what is in flight is still settled (bounded by the join), so its done marks are kept."""
        while True:
            with self._cond:
                flight = self._window.head()
                if flight is None:
                    if self._stop.is_set():
                        return
                    self._cond.wait(0.25)
                    continue
            try:
                self._deliverer.settle(flight.sent, self._settings.send_timeout)
            except SluiceError as exc:
                self._fail(exc)
                continue
            acked = self._clock()
            batch = flight.sent.batch
            with self._batch_lock:
                if self._settings.crash_after and self.delivered + len(batch) >= self._settings.crash_after:
                    log.warning("schedule: --crash-after-deliveries reached: exiting before the done marks")
                    os._exit(137)
                self._deliverer.settled(flight.sent)
                self._done(batch)
                with self._cond:
                    self._window.pop()
                    in_flight = len(self._window)
                    self._cond.notify_all()
            trace(
                "batch",
                n=len(batch),
                first_due=batch[0].due,
                last_due=batch[-1].due,
                popped=flight.popped,
                locked=flight.locked,
                sent=flight.sent_at,
                acked=acked,
                done=self._clock(),
                in_flight=in_flight,
            )
            self._count_delivered(batch, acked)

    def _fail(self, exc: SluiceError) -> None:
        """A batch failed, or its outcome is unknown: stop sending, let every request still on the wire
        land or fail, then recover all the batches in flight at once (found delivered: done; the rest
        back into the timeline, in order)."""
        metrics.ERRORS.labels("deliver").inc()
        with self._cond:
            self._window.broken = True
        with self._batch_lock:
            with self._cond:
                flights = self._window.take_all()
            entries = [e for f in flights for e in f.sent.batch]
            log.warning("schedule: delivering %d records failed (%s): recovering", len(entries), exc)
            deadline = time.monotonic() + self._settings.send_timeout
            for f in flights:
                self._deliverer.wait(f.sent, max(0.0, deadline - time.monotonic()))
                self._deliverer.forget(f.sent)
            self._after_failure(entries)
            with self._cond:
                self._window.broken = False
                self._cond.notify_all()

    def _count_delivered(self, batch: list[Entry], acked: int) -> None:
        self.delivered += len(batch)
        self.max_late_ms = max(self.max_late_ms, acked - batch[0].due)
        metrics.DELIVERED.inc(len(batch))
        metrics.PENDING.dec(len(batch))
        metrics.APPEND_BATCHES.observe(len(batch))
        for e in batch:
            metrics.LATENESS.observe(max(0, acked - e.due) / 1000)

    def _done(self, batch: list[Entry]) -> None:
        """Done marks for a delivered batch (``_batch_lock`` held): written, not fsynced (the checkpoint
        thread does that, so no fsync ever holds up a due record; until then the recovery marks cover
        the batch)."""
        with self._cond:
            done = self._timeline.delivered(batch)
        self._store.mark_done(done)

    def _checkpoint_loop(self) -> None:
        while not self._stop.wait(self._settings.checkpoint_interval):
            self._checkpoint_delivery()

    def _checkpoint_delivery(self) -> None:
        """Done marks durable, then the recovery marks they cover cleared; then delete the buckets that
        are over. Only the first step waits for the delivery loop (for the batch in flight, if any)."""
        with self._batch_lock:
            state = self._deliverer.begin_checkpoint()
            dirty = self._store.take_done_dirty()
        self._store.fsync_done(dirty)
        self._deliverer.end_checkpoint(state)
        # One step under both locks (store, then timeline: the only place they nest): a bucket the
        # timeline forgot must be gone from disk before a late record could make the reader load it again.
        with self._store_lock, self._cond:
            for bucket in self._timeline.finished(self._clock(), self._durable_read):
                self._store.delete(bucket)

    def _after_failure(self, batch: list[Entry]) -> None:
        """Batches whose outcome is unknown (``_fail``: all that were in flight, in send order): find which
        records reached their partitions, mark them done and send the rest again (in order: they go back
        into the timeline)."""
        self._deliverer.reset()
        # A request the failed producer still had on the wire may land late: let it, before looking.
        self._stop.wait(_DELIVERY_CONFIG.request_timeout.total_seconds())
        found = {(sp, so) for sp, so, _ in self._recover()}
        delivered = [e for e in batch if (e.sp, e.so) in found]
        if delivered:
            self._done(delivered)
            metrics.DELIVERED.inc(len(delivered))
            metrics.PENDING.dec(len(delivered))
        with self._cond:
            self._timeline.requeue([e for e in batch if (e.sp, e.so) not in found])

    def _recover(self) -> list[tuple[int, int, int]]:
        while True:
            try:
                return self._deliverer.recover(self._settings.send_timeout)
            except SluiceError as exc:
                metrics.ERRORS.labels("recover").inc()
                log.warning("schedule: recovery waits for the cluster (%s)", exc)
                time.sleep(0.5)

    def _recover_marks(self) -> None:
        """At start: what a crash left between a delivery and its durable done mark. Those records are
        marked done before any bucket is loaded, so they are never sent again."""
        by_bucket: dict[int, list[tuple[int, int]]] = {}
        for sp, so, due in self._recover():
            by_bucket.setdefault(self._store.bucket_of(due), []).append((sp, so))
        self._store.mark_done(by_bucket)
        self._checkpoint_delivery()
