"""The on-disk index of pending records: one append-only file per time bucket (PIP-195's bucket idea).

Bucket ``b`` holds the records due in ``[b * width, (b + 1) * width)`` ms, as frames (``entry.py``), and
``b<id>.done`` the schedule coordinates of those already delivered. Only the buckets about to be due are
read into memory (``timeline.py``); a bucket far ahead costs a file and nothing in memory, so millions of
pending records cost disk, not RAM. A bucket file may hold the same record twice (re-read from the
schedule topic after a crash before the read checkpoint): loading deduplicates by coordinates.
"""

from __future__ import annotations

import bisect
import os
import struct
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from sluice.broker.schedule.entry import Entry, decode_frames, encode_frame

__all__ = ["BucketStore"]

_DONE = struct.Struct("<iq")
#: Append handles kept open (each bucket written recently); the rest are reopened when written again.
_OPEN_FILES = 64


class BucketStore:
    def __init__(self, directory: Path, width_ms: int) -> None:
        self.dir = directory
        self.width_ms = width_ms
        directory.mkdir(parents=True, exist_ok=True)
        ids = {int(p.stem[1:]) for p in directory.glob("b*.log")}
        #: Bucket ids with a file, sorted.
        self.ids: list[int] = sorted(ids)
        self._fds: OrderedDict[int, int] = OrderedDict()
        self._dirty: set[int] = set()
        #: Buckets whose torn tail (if any) was cut off in this process (done before the first append).
        self._checked: set[int] = set()
        self._done_dirty: set[int] = set()

    def bucket_of(self, due_ms: int) -> int:
        return due_ms // self.width_ms

    def start_ms(self, bucket: int) -> int:
        return bucket * self.width_ms

    def _path(self, bucket: int, suffix: str = "log") -> Path:
        return self.dir / f"b{bucket}.{suffix}"

    def _fd(self, bucket: int) -> int:
        fd = self._fds.get(bucket)
        if fd is not None:
            self._fds.move_to_end(bucket)
            return fd
        path = self._path(bucket)
        if bucket not in self._checked:
            self._cut_torn_tail(path)
            self._checked.add(bucket)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if len(self._fds) >= _OPEN_FILES:
            old, old_fd = self._fds.popitem(last=False)
            if old in self._dirty:
                os.fsync(old_fd)
                self._dirty.discard(old)
            os.close(old_fd)
        self._fds[bucket] = fd
        i = bisect.bisect_left(self.ids, bucket)
        if i == len(self.ids) or self.ids[i] != bucket:
            self.ids.insert(i, bucket)
        return fd

    @staticmethod
    def _cut_torn_tail(path: Path) -> None:
        """A crash mid-write leaves a partial frame at the end: cut it, or frames appended after it would
        be unreadable (the loader stops at the first bad frame)."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        _, valid = decode_frames(data)
        if valid < len(data):
            os.truncate(path, valid)

    def append(self, entries: Iterable[Entry]) -> None:
        """Write entries to their buckets (durable after ``sync``)."""
        by_bucket: dict[int, list[bytes]] = {}
        for e in entries:
            by_bucket.setdefault(e.due // self.width_ms, []).append(encode_frame(e))
        for bucket, frames in by_bucket.items():
            os.write(self._fd(bucket), b"".join(frames))
            self._dirty.add(bucket)

    def sync(self) -> None:
        for bucket in self._dirty:
            fd = self._fds.get(bucket)
            if fd is not None:
                os.fsync(fd)
        self._dirty.clear()
        self._sync_dir()

    def _sync_dir(self) -> None:
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)  # new bucket files' names
        finally:
            os.close(dfd)

    def load(self, bucket: int) -> tuple[list[Entry], set[tuple[int, int]]]:
        """A bucket's records not yet delivered (deduplicated, in delivery order), and the coordinates
        of those delivered."""
        try:
            data = self._path(bucket).read_bytes()
        except FileNotFoundError:
            data = b""
        entries, _ = decode_frames(data)
        done = self.done_of(bucket)
        seen = set(done)
        out = []
        for e in entries:
            k = (e.sp, e.so)
            if k not in seen:
                seen.add(k)
                out.append(e)
        out.sort()
        return out, done

    def done_of(self, bucket: int) -> set[tuple[int, int]]:
        try:
            data = self._path(bucket, "done").read_bytes()
        except FileNotFoundError:
            return set()
        n = len(data) // _DONE.size
        return {_DONE.unpack_from(data, i * _DONE.size) for i in range(n)}

    def mark_done(self, done: dict[int, list[tuple[int, int]]]) -> None:
        """Record delivered coordinates per bucket (durable after ``sync_done``: until then the delivery
        side's recovery marks cover them, ``delivery.py``)."""
        for bucket, keys in done.items():
            fd = os.open(self._path(bucket, "done"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, b"".join(_DONE.pack(sp, so) for sp, so in keys))
            finally:
                os.close(fd)
            self._done_dirty.add(bucket)

    def take_done_dirty(self) -> set[int]:
        """The buckets whose done files were written since the last call (to ``fsync_done``)."""
        dirty, self._done_dirty = self._done_dirty, set()
        return dirty

    def fsync_done(self, buckets: set[int]) -> None:
        for bucket in buckets:
            try:
                fd = os.open(self._path(bucket, "done"), os.O_RDONLY)
            except FileNotFoundError:
                continue  # deleted since
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if buckets:
            self._sync_dir()

    def delete(self, bucket: int) -> None:
        fd = self._fds.pop(bucket, None)
        if fd is not None:
            os.close(fd)
        self._dirty.discard(bucket)
        for suffix in ("log", "done"):
            self._path(bucket, suffix).unlink(missing_ok=True)
        i = bisect.bisect_left(self.ids, bucket)
        if i < len(self.ids) and self.ids[i] == bucket:
            del self.ids[i]

    def close(self) -> None:
        self.sync()
        self.fsync_done(self.take_done_dirty())
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
