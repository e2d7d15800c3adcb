"""A broker's descriptor budget for its logs: a bounded LRU of read handles on sealed segments.

Each partition keeps exactly one descriptor open: its active segment's ``.log`` (appends and
tail reads, the hot path). Index files are written in batches (``persist()``) and opened only
for that write; sealed segments are read through :class:`ReadHandles`, one LRU of read-only
descriptors shared by every partition of the broker, so the broker holds at most
``partitions + capacity`` log descriptors whatever the number of segments. A fetch from an
old segment reopens it once and then hits the cache: one ``open`` per segment a catching-up
reader moves to, not one per batch. Sizing and the figures behind it: docs/storage.md.

Caller: ``Segment`` (reads of sealed segments) and ``PartitionLog`` (forget on close and
delete). Thread-safe: reads run on the event loop, close/delete may run elsewhere.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict

from sluice.errors import StorageError

#: LRU size a broker uses unless configured (``--segment-read-handles``).
DEFAULT_READ_HANDLES = 256

_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def storage_error(action: str, exc: OSError) -> StorageError:
    """The typed error for a failed open/create: says which limit was hit and what helps.

    STORAGE_ERROR is retriable: every cause here (descriptors, permissions fixed by an
    operator, a disk freed) can clear without restarting the broker.
    """
    if exc.errno in _OUT_OF_DESCRIPTORS:
        hint = "out of file descriptors; raise the open files limit (docs/kubernetes.md) or retry later"
    elif exc.errno == errno.ENOSPC:
        hint = "the disk is full"
    elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = "permission denied on the data directory"
    else:
        hint = exc.strerror or str(exc)
    name = errno.errorcode.get(exc.errno or 0, "EIO")
    return StorageError(f"{action} failed ({name}): {hint}")


class ReadHandles:
    """Bounded LRU of read-only descriptors of sealed segment files."""

    def __init__(self, capacity: int = DEFAULT_READ_HANDLES) -> None:
        if capacity < 1:
            raise ValueError(f"read handle capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._lock = threading.Lock()
        #: path -> descriptor, least recently used first.
        self._open: OrderedDict[str, int] = OrderedDict()
        #: path -> readers using its descriptor now: never closed under them.
        self._pins: dict[str, int] = {}
        #: Paths forgotten while pinned: closed by the last reader.
        self._doomed: set[str] = set()
        self.opens = 0
        self.hits = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._open)

    def acquire(self, path: str) -> int:
        """A read-only descriptor of ``path``, pinned (never closed) until ``release(path)``.

        Callers pair it with ``release`` in ``try/finally`` (a plain pair, not a context
        manager: this is on the read path, and a generator-based one cost 5x the pair).
        Raises StorageError (naming EMFILE, EACCES, ...) when the file cannot be opened.
        """
        with self._lock:
            fd = self._open.get(path)
            if fd is not None:
                self._open.move_to_end(path)
                self.hits += 1
            else:
                self._evict(self.capacity - 1)
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as exc:
                    raise storage_error(f"opening {path} for reading", exc) from exc
                self._open[path] = fd
                self.opens += 1
            self._pins[path] = self._pins.get(path, 0) + 1
            return fd

    def release(self, path: str) -> None:
        """Unpin a descriptor from ``acquire``."""
        with self._lock:
            left = self._pins[path] - 1
            if left:
                self._pins[path] = left
                return
            del self._pins[path]
            if path in self._doomed:
                self._doomed.discard(path)
                os.close(self._open.pop(path))
            else:
                self._evict(self.capacity)  # pinned entries may have pushed it over

    def _evict(self, keep: int) -> None:
        """Close least recently used, unpinned descriptors until at most ``keep`` are open."""
        if len(self._open) <= keep:
            return
        for path in list(self._open):
            if len(self._open) <= keep:
                break
            if path not in self._pins:
                os.close(self._open.pop(path))
                self.evictions += 1

    def forget(self, path: str) -> None:
        """Close ``path``'s descriptor (the segment is closed or deleted)."""
        with self._lock:
            if path in self._pins:
                self._doomed.add(path)
                return
            fd = self._open.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        with self._lock:
            for path in [p for p in self._open if p not in self._pins]:
                os.close(self._open.pop(path))
