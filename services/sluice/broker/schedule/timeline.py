"""The near future in memory: the buckets about to be due, each as a sorted run, in delivery order.

A bucket is read from disk ``preload_ms`` before it starts (so its first record is in memory when it is
due) and forgotten once every record in it was delivered and the read checkpoint covers it; a bucket
further ahead stays on disk. Memory is the near buckets' records, not the pending total (RocketMQ 5's
timer wheel keeps the same split between a small in-memory wheel and its on-disk timer log).

Buckets cover disjoint time ranges, so the first due record is always in the earliest loaded bucket that
still holds one. Each loaded bucket keeps the records it was loaded with as a sorted run (``load`` sorts
them, off the lock) and a small heap for those that came after (read from the schedule topic while the
bucket was in memory, or put back after a failed send). Installing a bucket is O(1) under the lock (a
single heap of every in-memory record had to be re-heapified, or pushed into record by record, under the
lock the delivery loop takes: a 100,000-record bucket held it for ~100 ms of CPU, seconds on a loaded
machine), and popping ``k`` due records costs O(k), whatever the number in memory.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from dataclasses import dataclass, field

from sluice.broker.schedule.buckets import BucketStore
from sluice.broker.schedule.entry import Entry

__all__ = ["Loaded", "Timeline"]


@dataclass
class Loaded:
    """One bucket in memory. Built by ``Loaded.of`` off the timeline's lock (it walks every record)."""

    #: Coordinates of every record of the bucket seen (pending, in flight or delivered): dedup.
    keys: set[tuple[int, int]]
    #: Records not yet delivered (in memory or in flight).
    pending: int
    #: The records loaded from the file, in delivery order; popped from the left.
    run: deque[Entry]
    #: Records that joined after the load (a heap in delivery order).
    late: list[Entry] = field(default_factory=list)
    #: The highest schedule offset per schedule partition in the bucket (for safe deletion).
    top: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, entries: list[Entry], done: set[tuple[int, int]]) -> Loaded:
        """``entries`` sorted in delivery order and not done (``BucketStore.load``'s answer)."""
        st = cls(done | {(e.sp, e.so) for e in entries}, len(entries), deque(entries))
        top = st.top
        for sp, so in st.keys:
            if so > top.get(sp, -1):
                top[sp] = so
        return st

    def first(self) -> Entry | None:
        run, late = self.run, self.late
        if run:
            return late[0] if late and late[0] < run[0] else run[0]
        return late[0] if late else None


class Timeline:
    def __init__(self, store: BucketStore, preload_ms: int) -> None:
        self.store = store
        self.preload_ms = preload_ms
        #: Added to ``preload_ms`` by the scheduler: how long reading a bucket in takes lately (twice
        #: that), so a slow read (a big bucket, a loaded machine) still ends before the bucket is due.
        self.lead_ms = 0
        #: Records in memory (not yet popped).
        self.size = 0
        self._loaded: dict[int, Loaded] = {}
        #: The loaded bucket ids, sorted: the first due record is in the first one with a record.
        self._order: list[int] = []
        self._upto: int | None = None

    @property
    def loaded_buckets(self) -> int:
        return len(self._loaded)

    def advance(self, now_ms: int) -> None:
        """Read in every bucket on disk that starts within ``preload_ms`` of now (all in one step)."""
        for bucket in self.plan(now_ms):
            self._load(bucket)
        self.planned(now_ms)

    def _horizon(self, now_ms: int) -> int:
        return self.store.bucket_of(now_ms + self.preload_ms + self.lead_ms)

    def plan(self, now_ms: int) -> list[int]:
        """The buckets to read in now. The caller reads them (``store.load`` and ``Loaded.of``, outside
        its lock: a bucket of 100,000 records takes a while to decode), installs them, then calls
        ``planned``."""
        upto = self._horizon(now_ms)
        if self._upto is not None and upto <= self._upto:
            return []
        ids = self.store.ids
        return [b for b in ids[: bisect.bisect_right(ids, upto)] if b not in self._loaded]

    def planned(self, now_ms: int) -> None:
        upto = self._horizon(now_ms)
        if self._upto is None or upto > self._upto:
            self._upto = upto

    def install(self, bucket: int, st: Loaded) -> None:
        if bucket in self._loaded:
            return
        self._loaded[bucket] = st
        bisect.insort(self._order, bucket)
        self.size += len(st.run) + len(st.late)

    def _load(self, bucket: int) -> None:
        self.install(bucket, Loaded.of(*self.store.load(bucket)))

    def add(self, entries: list[Entry]) -> bool:
        """New records, already appended to their bucket files: those in a loaded (near) bucket join it
        in memory. True when one of them is now the first due (the delivery loop must wake)."""
        first = self.first()
        for e in entries:
            bucket = self.store.bucket_of(e.due)
            if self._upto is None or bucket > self._upto:
                continue  # far ahead: on disk only
            st = self._loaded.get(bucket)
            if st is None:
                self._load(bucket)  # its file holds e already
                continue
            key = (e.sp, e.so)
            if key in st.keys:
                continue  # read again after a restart: known (pending or delivered)
            st.keys.add(key)
            st.pending += 1
            if e.so > st.top.get(e.sp, -1):
                st.top[e.sp] = e.so
            heapq.heappush(st.late, e)
            self.size += 1
        now_first = self.first()
        return now_first is not None and (first is None or now_first < first)

    def pop_due(self, now_ms: int, limit: int) -> list[Entry]:
        """Up to ``limit`` records due by ``now_ms``, in delivery order."""
        out: list[Entry] = []
        for bucket in self._order:
            st = self._loaded[bucket]
            run, late = st.run, st.late
            while len(out) < limit:
                if run and not (late and late[0] < run[0]):
                    if run[0].due > now_ms:
                        break
                    out.append(run.popleft())
                elif late:
                    if late[0].due > now_ms:
                        break
                    out.append(heapq.heappop(late))
                else:
                    break
            if run or late or len(out) >= limit:
                break  # a record not yet due (so neither are later buckets'), or the batch is full
        self.size -= len(out)
        return out

    def requeue(self, entries: list[Entry]) -> None:
        """Records whose send failed (and were not found delivered): back in memory, in order."""
        for e in entries:
            bucket = self.store.bucket_of(e.due)
            st = self._loaded.get(bucket)
            if st is None:  # not expected (a bucket with a record in flight is not finished)
                st = Loaded({(e.sp, e.so)}, 1, deque())
                self.install(bucket, st)
            heapq.heappush(st.late, e)
            self.size += 1

    def delivered(self, entries: list[Entry]) -> dict[int, list[tuple[int, int]]]:
        """Mark records delivered; their coordinates by bucket (for the done files)."""
        out: dict[int, list[tuple[int, int]]] = {}
        for e in entries:
            bucket = self.store.bucket_of(e.due)
            out.setdefault(bucket, []).append((e.sp, e.so))
            st = self._loaded.get(bucket)
            if st is not None:
                st.pending -= 1
        return out

    def finished(self, now_ms: int, durable_read: dict[int, int]) -> list[int]:
        """Buckets that can be deleted: past, fully delivered, and every record in them below the durable
        read checkpoint (so no re-read after a crash can bring one of them back)."""
        out = []
        for bucket in self._order:
            st = self._loaded[bucket]
            if self.store.start_ms(bucket + 1) > now_ms:
                break  # this one and the later ones are not over yet
            if st.pending:
                continue
            if all(so < durable_read.get(sp, 0) for sp, so in st.top.items()):
                out.append(bucket)
        for bucket in out:
            del self._loaded[bucket]
            self._order.remove(bucket)
        return out

    def first(self) -> Entry | None:
        """The first record in memory (None: none). Safe to call without the lock for a gauge: another
        thread's pop may make it stale, never wrong about some record's due time."""
        for bucket in list(self._order):
            st = self._loaded.get(bucket)
            if st is None:
                continue
            try:
                e = st.first()
            except IndexError:  # popped by another thread between the checks
                continue
            if e is not None:
                return e
        return None

    def next_due(self) -> int | None:
        e = self.first()
        return None if e is None else e.due
