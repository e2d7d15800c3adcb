"""Keeping CPython's full garbage collections off the heartbeat path.

A coordinator with thousands of group members holds hundreds of thousands of long-lived objects (records,
soft state, each member's heartbeat stream). A full (generation 2) collection walks every one of them with
the event loop stopped: measured 0.2-0.4 s at 5,000 members, so every heartbeat in flight waits that
long. These objects live for the whole membership, so walking them finds nothing: once they have lived a
while they are moved out of the collector's sight (``gc.freeze()``), and full collections only walk what
was created since.

A frozen object is still freed by reference counting when the last reference goes; only garbage *cycles*
among frozen objects (e.g. the tasks of a stream that closed) wait for the occasional complete collection
that unfreezes everything (``full_every_s``), which is the one pause left, and is logged.

Caller: the service's group timer, about once a second (``tick``).
"""

from __future__ import annotations

import gc
import logging
import time

__all__ = ["HeapKeeper"]

log = logging.getLogger(__name__)


class HeapKeeper:
    def __init__(self, freeze_every_s: float = 10.0, full_every_s: float = 1800.0) -> None:
        self._freeze_every_s = freeze_every_s
        self._full_every_s = full_every_s
        now = time.monotonic()
        self._last_freeze = now
        self._last_full = now

    def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_full >= self._full_every_s:
            self._last_full = self._last_freeze = now
            gc.unfreeze()
            started = time.perf_counter()
            found = gc.collect()
            gc.freeze()
            log.info(
                "full garbage collection: %d unreachable objects, %.0f ms, %d objects frozen again",
                found,
                (time.perf_counter() - started) * 1000,
                gc.get_freeze_count(),
            )
        elif now - self._last_freeze >= self._freeze_every_s:
            self._last_freeze = now
            gc.freeze()
