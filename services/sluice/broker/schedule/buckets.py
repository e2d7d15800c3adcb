"""The on-disk index of pending records: one append-only file per time bucket (PIP-195's bucket idea).

Bucket ``b`` holds the records due in ``[b * width, (b + 1) * width)`` ms, as frames (``entry.py``), and
``b<id>.done`` the schedule coordinates of those already delivered. Only the buckets about to be due are
read into memory (``timeline.py``); a bucket far ahead costs a file and nothing in memory, so millions of
pending records cost disk, not RAM. A bucket file may hold the same record twice (re-read from the
schedule topic after a crash before the read checkpoint): loading deduplicates by coordinates.
"""

from __future__ import annotations

import bisect
import heapq
import os
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

from sluice.broker.schedule.entry import Entry, count_frames, decode_frames, encode_frame

__all__ = ["BucketStore"]

_DONE = struct.Struct("<iq")
#: Append handles kept open (each bucket written recently); the rest are reopened when written again.
_OPEN_FILES = 256
#: Records due further ahead than this go to hour-wide *coarse* buckets (``c<id>.log``), split into the
#: fine ones when they come within it: a hierarchical timing wheel of two levels, so indexing records
#: spread over days writes to a few hundred files, not tens of thousands.
COARSE_MS = 3_600_000
HORIZON_MS = 2 * COARSE_MS


#: Entries sorted at a time by a ``load`` that may pause (``_sorted``).
_SORT_CHUNK = 2_000


def _sorted(entries: list[Entry], pause: Callable[[], None] | None) -> list[Entry]:
    """``entries`` in delivery order. With ``pause``: sorted in chunks, pausing between them, and merged
    by ``heapq.merge`` (Python code, so the interpreter can switch threads inside it). One ``list.sort``
    is a single C call that holds the GIL throughout: 100,000 entries took 1.3-2 s at load 20 on the
    2-core machine, and the delivery thread could not run meanwhile (docs/delayed-delivery.md)."""
    if pause is None or len(entries) <= _SORT_CHUNK:
        entries.sort()
        return entries
    chunks = []
    for i in range(0, len(entries), _SORT_CHUNK):
        chunks.append(sorted(entries[i : i + _SORT_CHUNK]))
        pause()
    return list(heapq.merge(*chunks))


class BucketStore:
    def __init__(self, directory: Path, width_ms: int) -> None:
        self.dir = directory
        self.width_ms = width_ms
        directory.mkdir(parents=True, exist_ok=True)
        #: Fine bucket ids with a file, sorted; coarse ones likewise.
        self.ids: list[int] = sorted(int(p.stem[1:]) for p in directory.glob("b*.log"))
        self.coarse_ids: list[int] = sorted(int(p.stem[1:]) for p in directory.glob("c*.log"))
        #: Open append handles by file name (``b<id>``, ``c<id>``), least recently used first.
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._dirty: set[str] = set()
        #: Written since the last sync, then closed to make room: fsynced by path at the next sync.
        self._dirty_closed: set[str] = set()
        #: Files whose torn tail (if any) was cut off in this process (done before the first append).
        self._checked: set[str] = set()
        self._done_dirty: set[int] = set()

    def bucket_of(self, due_ms: int) -> int:
        return due_ms // self.width_ms

    def start_ms(self, bucket: int) -> int:
        return bucket * self.width_ms

    def _path(self, bucket: int, suffix: str = "log") -> Path:
        return self.dir / f"b{bucket}.{suffix}"

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is not None:
            self._fds.move_to_end(name)
            return fd
        path = self.dir / f"{name}.log"
        if name not in self._checked:
            self._cut_torn_tail(path)
            self._checked.add(name)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if len(self._fds) >= _OPEN_FILES:
            old, old_fd = self._fds.popitem(last=False)
            if old in self._dirty:
                self._dirty.discard(old)
                self._dirty_closed.add(old)
            os.close(old_fd)
        self._fds[name] = fd
        ids, key = (self.ids, int(name[1:])) if name[0] == "b" else (self.coarse_ids, int(name[1:]))
        i = bisect.bisect_left(ids, key)
        if i == len(ids) or ids[i] != key:
            ids.insert(i, key)
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

    def append(self, entries: Iterable[Entry], now_ms: int | None = None) -> None:
        """Write entries to their buckets (durable after ``sync``): a fine one, or a coarse one for a
        record due beyond the horizon from ``now_ms`` (None: fine only)."""
        far = None if now_ms is None else now_ms + HORIZON_MS
        by_file: dict[str, list[bytes]] = {}
        for e in entries:
            coarse = far is not None and e.due >= far
            name = f"c{e.due // COARSE_MS}" if coarse else f"b{e.due // self.width_ms}"
            by_file.setdefault(name, []).append(encode_frame(e))
        for name, frames in by_file.items():
            os.write(self._fd(name), b"".join(frames))
            self._dirty.add(name)

    def split_due(self, now_ms: int) -> int:
        """Split the coarse buckets that start within the horizon into fine ones: fine files written and
        fsynced before the coarse file goes, so a crash in between only leaves duplicates, which loading
        removes. Returns the records moved."""
        moved = 0
        while self.coarse_ids and self.coarse_ids[0] * COARSE_MS <= now_ms + HORIZON_MS:
            coarse = self.coarse_ids[0]
            name = f"c{coarse}"
            fd = self._fds.pop(name, None)
            if fd is not None:
                os.close(fd)
            self._dirty.discard(name)
            self._dirty_closed.discard(name)
            path = self.dir / f"{name}.log"
            try:
                entries, _ = decode_frames(path.read_bytes())
            except FileNotFoundError:
                entries = []
            self.append(entries)
            self.sync()
            path.unlink(missing_ok=True)
            self._sync_dir()
            self._checked.discard(name)
            del self.coarse_ids[0]
            moved += len(entries)
        return moved

    def sync(self) -> None:
        for name in self._dirty:
            os.fsync(self._fds[name])
        for name in self._dirty_closed:
            try:
                fd = os.open(self.dir / f"{name}.log", os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._dirty.clear()
        self._dirty_closed.clear()
        self._sync_dir()

    def _sync_dir(self) -> None:
        dfd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(dfd)  # new bucket files' names
        finally:
            os.close(dfd)

    def load(
        self, bucket: int, pause: Callable[[], None] | None = None
    ) -> tuple[list[Entry], set[tuple[int, int]]]:
        """A bucket's records not yet delivered (deduplicated, in delivery order), and the coordinates
        of those delivered. ``pause``: see ``decode_frames``."""
        try:
            data = self._path(bucket).read_bytes()
        except FileNotFoundError:
            data = b""
        entries, _ = decode_frames(data, pause)
        done = self.done_of(bucket)
        seen = set(done)
        out = []
        for e in entries:
            k = (e.sp, e.so)
            if k not in seen:
                seen.add(k)
                out.append(e)
        return _sorted(out, pause), done

    def size(self, bucket: int) -> int:
        """Bytes of a fine bucket's file (0 when it has none)."""
        try:
            return self._path(bucket).stat().st_size
        except FileNotFoundError:
            return 0

    def count_pending(self) -> int:
        """Records in the bucket files minus those marked done (the pending gauge's start value): the
        frames are counted by their length prefixes, never decoded, so 10 million cost seconds. A record
        written twice (re-read after a crash) counts twice until its bucket is loaded."""
        total = 0
        for path in [*self.dir.glob("b*.log"), *self.dir.glob("c*.log")]:
            total += count_frames(path)
        for path in self.dir.glob("b*.done"):
            total -= path.stat().st_size // _DONE.size
        return max(0, total)

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
        name = f"b{bucket}"
        fd = self._fds.pop(name, None)
        if fd is not None:
            os.close(fd)
        self._dirty.discard(name)
        self._dirty_closed.discard(name)
        self._checked.discard(name)
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
