"""What stops a service's event loop, measured, and the collector tuned so it stops it less.

Every record a service handles passes through one event loop; anything that holds that loop holds every
record in flight, and shows as tail latency (docs/latency.md). Two such holds are measured here, in every
service (``serve`` calls :func:`watch_pauses` once started):

- **garbage collections** (``sluice_gc_pause_seconds{service,generation}``): each collection's duration,
  timed by ``gc.callbacks`` (two ``perf_counter`` calls per collection, nothing per object);
- **event-loop lag** (``sluice_event_loop_lag_seconds{service}``): how late a callback scheduled every
  ``LAG_PROBE_S`` ran. It is off the record path (a timer of its own), and catches every stall: a long
  callback, a GC pause, the process not getting a core.

:func:`tune_gc` is the collector's setting for a service (called with ``gc.freeze()`` once start-up is
done): generation 0 collected every ``GEN0_THRESHOLD`` net allocations instead of 700. A record's trip
through a service allocates a few hundred container objects that die by reference counting, so at
thousands of records a second the default ran a young collection every few milliseconds, each walking
objects that were already gone by the next one. Raising it makes them rarer; each stays short because
what survives start-up is frozen out of the collector's sight (``gc.freeze()``), so an older-generation
collection walks only what requests left behind.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Histogram

__all__ = ["GEN0_THRESHOLD", "LAG_PROBE_S", "tune_gc", "watch_pauses"]

#: Young-generation threshold (net container allocations between collections). 10,000 (the dispatcher's
#: measured value since issue 9) and the older generations' 20 keep a full pass rare.
GEN0_THRESHOLD = 10_000
#: How often the loop-lag probe runs: often enough to catch a stall, rarely enough to cost nothing.
LAG_PROBE_S = 0.1

# 20 us .. 1 s: young collections take tens of microseconds, a full one on a big heap hundreds of ms.
PAUSE_BUCKETS = (2e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)

GC_PAUSE = Histogram(
    "sluice_gc_pause_seconds",
    "Duration of each cyclic garbage collection (the event loop stands still meanwhile)",
    ["service", "generation"],
    buckets=PAUSE_BUCKETS,
)
LOOP_LAG = Histogram(
    "sluice_event_loop_lag_seconds",
    f"How late a callback scheduled every {LAG_PROBE_S}s on the service's event loop ran",
    ["service"],
    buckets=PAUSE_BUCKETS,
)


def tune_gc() -> None:
    """The collector's thresholds for a service process (see the module docstring)."""
    gc.set_threshold(GEN0_THRESHOLD, 20, 20)


class _GcTimer:
    """A ``gc.callbacks`` entry that observes each collection's duration."""

    def __init__(self, service: str) -> None:
        self._by_generation = [GC_PAUSE.labels(service, str(g)) for g in range(3)]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._by_generation[min(int(info.get("generation", 2)), 2)].observe(
                time.perf_counter() - self._started
            )


def watch_pauses(service: str) -> Callable[[], None]:
    """Time every collection and probe the running loop's lag, for the life of the process (the probe
    ends with the loop; the returned function stops it, for a test). The lag is measured with
    ``perf_counter`` against when the probe was due; uvloop's timers have millisecond resolution, so
    lags under about a millisecond are timer granularity, not stalls."""
    if not any(isinstance(cb, _GcTimer) for cb in gc.callbacks):
        gc.callbacks.append(_GcTimer(service))
    loop = asyncio.get_running_loop()
    lag = LOOP_LAG.labels(service)
    handle: list[asyncio.TimerHandle] = []

    def probe(due: float) -> None:
        now = time.perf_counter()
        lag.observe(max(now - due, 0.0))
        handle[0] = loop.call_later(LAG_PROBE_S, probe, now + LAG_PROBE_S)

    handle.append(loop.call_later(LAG_PROBE_S, probe, time.perf_counter() + LAG_PROBE_S))

    def stop() -> None:
        handle[0].cancel()  # the probe's latest timer, not the first one

    return stop
