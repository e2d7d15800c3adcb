"""Where a record's time goes inside this process's SDK: per-stage latency histograms, client-side.

Each stage is observed once per batch, request or answer, never per record (a lock, a ``bisect`` and two
additions), for every producer and fetcher of the process together (docs/latency.md, docs/metrics.md):

- ``producer_queue``: a batch's oldest record waiting in the producer, from its batch being opened to its
  request being handed to the connection (the linger, and any wait for an in-flight slot);
- ``producer_ack``: a produce request from handed to the connection to its answer read (network both
  ways and the broker's append);
- ``fetch_handoff``: a fetch answer from read off the socket by the connection's reader thread to taken by
  the thread calling ``fetch()`` (the thread hand-off, and any time the caller spent elsewhere);
- ``fetch_decode``: one ``fetch()``'s batches decoded into records.

The SDK does not depend on ``prometheus_client``: :func:`snapshot` returns the figures as a dict, and an
application that serves Prometheus metrics exports them with :func:`register_prometheus` (one collector,
``sluice_client_stage_seconds{stage}``).
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["BUCKETS", "STAGES", "StageHistogram", "register_prometheus", "snapshot", "stage"]

#: Upper bounds in seconds: 10 us .. 10 s (the last bucket, +Inf, takes the rest).
BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0, 10.0)
STAGES = ("producer_queue", "producer_ack", "fetch_handoff", "fetch_decode")


class StageHistogram:
    """Counts per bucket, a count and a sum; thread-safe."""

    __slots__ = ("_counts", "_lock", "count", "sum")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = [0] * (len(BUCKETS) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(BUCKETS, seconds)
        with self._lock:
            self._counts[i] += 1
            self.count += 1
            self.sum += seconds

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Observe how long the ``with`` block took."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.observe(time.perf_counter() - started)

    def buckets(self) -> list[int]:
        """Counts per bucket (not cumulative), the last one above ``BUCKETS[-1]``."""
        with self._lock:
            return list(self._counts)

    def quantile(self, q: float) -> float:
        """The upper bound of the bucket holding quantile ``q`` (0 when empty; inf past the last)."""
        counts = self.buckets()
        total = sum(counts)
        if not total:
            return 0.0
        rank, seen = q * total, 0
        for i, n in enumerate(counts):
            seen += n
            if seen >= rank and n:
                return BUCKETS[i] if i < len(BUCKETS) else float("inf")
        return float("inf")


_stages = {name: StageHistogram() for name in STAGES}


def stage(name: str) -> StageHistogram:
    """The process-wide histogram of stage ``name`` (one of :data:`STAGES`)."""
    return _stages[name]


def snapshot() -> dict[str, dict[str, Any]]:
    """Every stage's count, sum (s), bucket counts and p50/p99/p99.9 upper bounds (s)."""
    return {
        name: {
            "count": h.count,
            "sum_s": h.sum,
            "buckets": dict(zip([*map(str, BUCKETS), "+Inf"], h.buckets(), strict=True)),
            "p50_s": h.quantile(0.5),
            "p99_s": h.quantile(0.99),
            "p999_s": h.quantile(0.999),
        }
        for name, h in _stages.items()
    }


def register_prometheus(registry: Any = None) -> None:
    """Export the stages as ``sluice_client_stage_seconds{stage}`` through ``prometheus_client`` (which
    the application installs; ``registry`` defaults to its global one)."""
    from prometheus_client import REGISTRY
    from prometheus_client.core import HistogramMetricFamily

    class _Collector:
        def collect(self) -> Iterator[HistogramMetricFamily]:
            family = HistogramMetricFamily(
                "sluice_client_stage_seconds", "Time spent in one stage of the Sluice SDK", labels=["stage"]
            )
            for name, h in _stages.items():
                cumulative, running = [], 0
                for bound, n in zip([*map(str, BUCKETS), "+Inf"], h.buckets(), strict=True):
                    running += n
                    cumulative.append((bound, running))
                family.add_metric([name], cumulative, h.sum)
            yield family

    (registry if registry is not None else REGISTRY).register(_Collector())
