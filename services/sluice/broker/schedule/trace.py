"""A timeline the scheduler writes of itself, to find what a lateness stall was (docs/delayed-delivery.md).

Off unless ``SLUICE_SCHEDULER_TRACE`` names a file. One JSON line per event, wall-clock ms: a delivery
batch (``batch``: when it was popped, its earliest and latest due time, when its appends were
acknowledged, when its done marks were written) and a bucket read-in (``load``: start, end, records).
Also a line for each cyclic garbage collection of 5 ms or more (``gc``: it holds the GIL, so every
thread waits). A batch's ``locked`` is when its send took the batch lock, ``sent`` when the send returned
(pipelined: before the answers), ``in_flight`` how many later batches were still unanswered when it was
settled. A few hundred lines a second at 10,000 due records/s; a profile aggregated over a run cannot
say which of the scheduler's threads, or the broker's acknowledgement, a stall of one second was, and
this can.
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from typing import IO, Any

__all__ = ["TRACE_ENV", "trace"]

TRACE_ENV = "SLUICE_SCHEDULER_TRACE"

_lock = threading.Lock()
_file: IO[str] | None = None
_opened = False


def trace(kind: str, **fields: Any) -> None:
    """Append one event (no-op without ``SLUICE_SCHEDULER_TRACE``)."""
    global _file, _opened
    if not _opened:
        with _lock:
            if not _opened:
                path = os.environ.get(TRACE_ENV)
                _file = open(path, "a", buffering=1) if path else None  # noqa: SIM115 (kept open)
                _opened = True
                if _file is not None:
                    gc.callbacks.append(_gc_event)
    if _file is None:
        return
    line = json.dumps({"kind": kind, "at": int(time.time() * 1000), **fields})
    with _lock:
        _file.write(line + "\n")


_gc_started: list[float] = [0.0]


def _gc_event(phase: str, info: dict[str, int]) -> None:
    """A cyclic collection that took 5 ms or more (it holds the GIL: every thread of the process waits)."""
    if phase == "start":
        _gc_started[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _gc_started[0]) * 1000
    if ms >= 5:
        trace("gc", generation=info.get("generation"), ms=round(ms, 1), collected=info.get("collected"))
