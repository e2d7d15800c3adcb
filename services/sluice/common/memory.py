"""Give the C allocator's free memory back to the system, now and then (glibc ``malloc_trim``).

Why: Python hands every object over 512 bytes (read buffers, dict tables, deque blocks, the
batches a dispatcher cuts for its consumers) to ``malloc``. After a burst, glibc keeps the freed
memory in its heap and returns only what lies at the very top, so a process that once held a lot
keeps that RSS although nothing uses it. Measured on the dispatcher (``bench/push_consumers_memory.py``,
200 subscriptions that each took a 1,000-record backlog): 68 KB per subscription was such free
memory, a third of what the subscriptions seemed to cost (``docs/dispatcher.md``, "What a
subscription costs"). ``malloc_trim(0)`` releases every free page of the heap (``madvise``), not
only the top.

It runs in a worker thread (``ctypes`` releases the GIL), so the event loop is not held while it
walks the heap: a few milliseconds per 100 MB. Where the C library is not glibc it does nothing.

Arenas (:func:`limit_arenas`): glibc gives each thread that meets contention an arena of its own, up
to 8 per core, and memory freed in one arena serves only that arena. gRPC's threads, the trim thread
and ``to_thread`` work each can pin an arena's high-water mark. ``MALLOC_ARENA_MAX=2`` (set by
``sluice up`` and the chart for every service) caps them; :func:`tune_allocator` does the same with
``mallopt`` at start-up, before the threads exist, and fixes the mmap threshold (``docs/memory.md``).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = ["ARENA_MAX", "TRIM_INTERVAL", "trim_free_memory", "trim_loop", "tune_allocator"]

#: Arenas a service process uses unless ``MALLOC_ARENA_MAX`` says otherwise.
ARENA_MAX = 2
#: Allocations from this size up get pages of their own (``mmap``), given back when freed. glibc starts
#: at 128 KiB too, but raises the threshold (up to 32 MiB) each time such a block is freed, after which
#: the 1 MiB fetch answers and batches land in the heap, interleaved with long-held ones, and their
#: pages stay in the RSS until a trim (measured: +14 MiB over a 16 MiB budget while a held backlog
#: and a flowing subscription mixed). Setting it fixes it there.
MMAP_THRESHOLD = 128 * 1024
_M_ARENA_MAX, _M_MMAP_THRESHOLD = -8, -3  # glibc's mallopt parameters (malloc.h)

#: Seconds between trims: long enough that the cost (a walk of the heap) is negligible, short enough
#: that memory a burst freed goes back soon after.
TRIM_INTERVAL = 10.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn: Callable[[int], int] = ctypes.CDLL(None).malloc_trim  # the process's own C library
    except (OSError, AttributeError):
        return None  # not glibc: nothing to call
    return fn


_TRIM = _malloc_trim()


def trim_free_memory() -> bool:
    """Return the heap's free pages to the system; False where there is no ``malloc_trim``."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def tune_allocator(arenas: int = ARENA_MAX, mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Cap glibc's malloc arenas and fix its mmap threshold, unless the environment already set them
    (``MALLOC_ARENA_MAX``, ``MALLOC_MMAP_THRESHOLD_``: glibc read those at start-up). False where
    there is no glibc. Call before starting threads: arenas made earlier stay."""
    try:
        mallopt: Callable[[int, int], int] = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    ok = True
    if not os.environ.get("MALLOC_ARENA_MAX"):
        ok = mallopt(_M_ARENA_MAX, arenas) == 1
    if not os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1 and ok
    return ok


async def trim_loop(interval: float = TRIM_INTERVAL) -> None:
    """Trim every ``interval`` seconds until cancelled (a service's background task)."""
    if _TRIM is None:
        log.debug("no malloc_trim in this C library: free heap memory is not returned early")
        return
    while True:
        await asyncio.sleep(interval)
        await asyncio.to_thread(trim_free_memory)
