"""Per-RPC Prometheus metrics, named ``sluice_<service>_rpc_*``.

Metric objects are created once per service name and cached, so tests that run
several services in one process do not register a name twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from threading import Lock

from prometheus_client import Counter, Histogram

# Latency buckets from 100 us to 30 s: long-poll fetches sit near max_wait.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


@dataclass(frozen=True)
class RpcMetrics:
    requests: Counter
    latency: Histogram
    errors: Counter


_cache: dict[str, RpcMetrics] = {}
_lock = Lock()


def metric_prefix(service: str) -> str:
    return "sluice_" + service.replace("-", "_")


def rpc_metrics(service: str) -> RpcMetrics:
    with _lock:
        m = _cache.get(service)
        if m is None:
            prefix = metric_prefix(service)
            m = RpcMetrics(
                requests=Counter(
                    f"{prefix}_rpc_requests", "RPCs handled, by method and result code", ["method", "code"]
                ),
                latency=Histogram(
                    f"{prefix}_rpc_duration_seconds",
                    "RPC handling time, by method",
                    ["method"],
                    buckets=LATENCY_BUCKETS,
                ),
                errors=Counter(
                    f"{prefix}_rpc_errors",
                    "RPCs that ended in an error, by method and code",
                    ["method", "code"],
                ),
            )
            _cache[service] = m
        return m
