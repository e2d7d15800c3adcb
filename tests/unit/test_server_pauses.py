"""GC pauses and event-loop lag are measured in every service (server/pauses.py)."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import REGISTRY

from sluice.server.pauses import GEN0_THRESHOLD, LAG_PROBE_S, tune_gc, watch_pauses


def _sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _stall(seconds: float) -> None:
    """Hold the event loop's thread, as a long callback would."""
    time.sleep(seconds)


def test_collections_and_a_stalled_loop_are_observed() -> None:
    before_gc = _sample("sluice_gc_pause_seconds_count", {"service": "pauses-test", "generation": "2"})
    before_lag = _sample("sluice_event_loop_lag_seconds_sum", {"service": "pauses-test"})

    async def run() -> None:
        stop = watch_pauses("pauses-test")
        try:
            gc.collect()  # a full collection: generation 2
            await asyncio.sleep(LAG_PROBE_S / 2)
            _stall(LAG_PROBE_S * 2)  # the loop stalls past the probe's due time
            await asyncio.sleep(LAG_PROBE_S * 2)
        finally:
            stop()

    asyncio.run(run())
    assert _sample("sluice_gc_pause_seconds_count", {"service": "pauses-test", "generation": "2"}) > before_gc
    lag = _sample("sluice_event_loop_lag_seconds_sum", {"service": "pauses-test"}) - before_lag
    assert lag >= LAG_PROBE_S  # the stall, seen by the probe


def test_tune_gc_sets_the_service_thresholds() -> None:
    saved = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (GEN0_THRESHOLD, 20, 20)
    finally:
        gc.set_threshold(*saved)
