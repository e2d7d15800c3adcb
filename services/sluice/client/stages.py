"""Where a record's time goes inside this process's SDK: per-stage latency histograms, client-side.

Each stage is observed once per batch, request or answer, never per record (a lock, a ``bisect`` and two
additions), for every producer and fetcher of the process together (docs/latency.md, docs/metrics.md):

- ``producer_queue``: a batch's oldest record waiting in the producer, from its batch being opened to its
  request being handed to the connection (the linger, and any wait for an in-flight slot);
- ``producer_ack``: a produce request from handed to the connection to its answer read (network both
  ways and the broker's append);
- ``fetch_handoff``: a fetch answer from read off the socket (by the connection's reader thread, or by the
  thread calling ``fetch()`` when it drives its lane) to taken by that thread (the thread hand-off, if
  any, and any time the caller spent elsewhere);
- ``fetch_decode``: one ``fetch()``'s batches decoded into records.

The SDK does not depend on ``prometheus_client``: :func:`snapshot` returns the figures as a dict, and an
application that serves Prometheus metrics exports them with :func:`register_prometheus` (one collector,
``sluice_client_stage_seconds{stage}``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sluice.common.stage_histogram import StageHistogram, histogram_family

__all__ = ["BUCKETS", "STAGES", "StageHistogram", "register_prometheus", "snapshot", "stage"]

#: Upper bounds in seconds: 10 us .. 10 s (the last bucket, +Inf, takes the rest).
BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0, 10.0)
STAGES = ("producer_queue", "producer_ack", "fetch_handoff", "fetch_decode")


_stages = {name: StageHistogram(BUCKETS) for name in STAGES}


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

    class _Collector:
        def collect(self) -> Iterator[Any]:
            yield histogram_family(
                "sluice_client_stage_seconds", "Time spent in one stage of the Sluice SDK", "stage", _stages
            )

    (registry if registry is not None else REGISTRY).register(_Collector())
