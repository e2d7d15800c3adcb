"""The near future in memory: the buckets about to be due, as one heap in delivery order.

A bucket is read from disk ``preload_ms`` before it starts (so its first record is in memory when it is
due) and forgotten once every record in it was delivered and the read checkpoint covers it; a bucket
further ahead stays on disk. Memory is the near buckets' records, not the pending total (RocketMQ 5's
timer wheel keeps the same split between a small in-memory wheel and its on-disk timer log).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from sluice.broker.schedule.buckets import BucketStore
from sluice.broker.schedule.entry import Entry

__all__ = ["Timeline"]


@dataclass
class _Loaded:
    #: Coordinates of every record of the bucket seen (pending, in flight or delivered): dedup.
    keys: set[tuple[int, int]]
    #: Records not yet delivered (in the heap or in flight).
    pending: int
    #: The highest schedule offset per schedule partition in the bucket (for safe deletion).
    top: dict[int, int] = field(default_factory=dict)


class Timeline:
    def __init__(self, store: BucketStore, preload_ms: int) -> None:
        self.store = store
        self.preload_ms = preload_ms
        #: Added to ``preload_ms`` by the scheduler: how long reading a bucket in takes lately (twice
        #: that), so a slow read (a big bucket, a loaded machine) still ends before the bucket is due.
        self.lead_ms = 0
        self.heap: list[Entry] = []
        self._loaded: dict[int, _Loaded] = {}
        self._upto: int | None = None

    @property
    def loaded_buckets(self) -> int:
        return len(self._loaded)

    def advance(self, now_ms: int) -> None:
        """Read in every bucket on disk that starts within ``preload_ms`` of now (all in one step)."""
        for bucket in self.plan(now_ms):
            self.install(bucket, *self.store.load(bucket))
        self.planned(now_ms)

    def plan(self, now_ms: int) -> list[int]:
        """The buckets to read in now. The caller reads them (``store.load``, outside its lock: a bucket
        of 100,000 records takes a while to decode, and due records must not wait for it), installs
        them, then calls ``planned``."""
        upto = self.store.bucket_of(now_ms + self.preload_ms + self.lead_ms)
        if self._upto is not None and upto <= self._upto:
            return []
        out = []
        for bucket in list(self.store.ids):
            if bucket > upto:
                break
            if bucket not in self._loaded:
                out.append(bucket)
        return out

    def planned(self, now_ms: int) -> None:
        upto = self.store.bucket_of(now_ms + self.preload_ms + self.lead_ms)
        if self._upto is None or upto > self._upto:
            self._upto = upto

    def install(self, bucket: int, entries: list[Entry], done: set[tuple[int, int]]) -> None:
        if bucket in self._loaded:
            return
        st = _Loaded(done | {(e.sp, e.so) for e in entries}, len(entries))
        for sp, so in [*done, *((e.sp, e.so) for e in entries)]:
            if so > st.top.get(sp, -1):
                st.top[sp] = so
        if len(entries) > len(self.heap) // 8:
            self.heap.extend(entries)
            heapq.heapify(self.heap)
        else:
            for e in entries:
                heapq.heappush(self.heap, e)
        self._loaded[bucket] = st

    def _load(self, bucket: int) -> None:
        self.install(bucket, *self.store.load(bucket))

    def add(self, entries: list[Entry]) -> bool:
        """New records, already appended to their bucket files: those in a loaded (near) bucket join the
        heap. True when one of them is now the first due (the delivery loop must wake)."""
        first = self.heap[0] if self.heap else None
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
            heapq.heappush(self.heap, e)
        return bool(self.heap) and (first is None or self.heap[0] < first)

    def pop_due(self, now_ms: int, limit: int) -> list[Entry]:
        heap = self.heap
        out: list[Entry] = []
        while heap and heap[0].due <= now_ms and len(out) < limit:
            out.append(heapq.heappop(heap))
        return out

    def requeue(self, entries: list[Entry]) -> None:
        for e in entries:
            heapq.heappush(self.heap, e)

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
        for bucket, st in self._loaded.items():
            if st.pending or self.store.start_ms(bucket + 1) > now_ms:
                continue
            if all(so < durable_read.get(sp, 0) for sp, so in st.top.items()):
                out.append(bucket)
        for bucket in out:
            del self._loaded[bucket]
        return out

    def next_due(self) -> int | None:
        return self.heap[0].due if self.heap else None
