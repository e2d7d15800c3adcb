"""Per-RPC Prometheus metrics, named ``sluice_<service>_rpc_*``.

Metric objects are created once per service name and cached, so tests that run
several services in one process do not register a name twice.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from threading import Lock

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from sluice.common.stage_histogram import StageHistogram, histogram_family

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
    latency: MethodLatencies
    errors: Counter


class MethodLatencies(Collector):
    """``<prefix>_rpc_duration_seconds{method}``: one cheap histogram per method
    (``common/stage_histogram.py``), read when Prometheus scrapes. prometheus-client's
    ``Histogram.observe`` cost 5 µs per request, 2-3% of the broker's CPU per record at one record
    per request; this one costs about 1.4 µs (docs/latency.md)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._by_method: dict[str, StageHistogram] = {}
        self._lock = Lock()

    def labels(self, method: str) -> StageHistogram:
        with self._lock:
            h = self._by_method.get(method)
            if h is None:
                h = self._by_method[method] = StageHistogram(LATENCY_BUCKETS)
            return h

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            by_method = dict(self._by_method)
        yield histogram_family(self._name, "RPC handling time, by method", "method", by_method)


_cache: dict[str, RpcMetrics] = {}
_lock = Lock()

#: Real internal errors (a bug, an unexpected exception escaping a handler), by service and method. They
#: stay INTERNAL to the caller; bad input never counts here (it is a typed error, counted under
#: ``*_rpc_errors``). The fuzz suite asserts this stays 0 on every service after garbage on every RPC.
INTERNAL_ERRORS = Counter(
    "sluice_internal_errors",
    "Requests that failed with an internal error (a bug, not bad input), by service and method",
    ["service", "method"],
)


#: 1, labelled with what runs: the dashboards show versions per pod (a rolling upgrade half done is two
#: versions), and ``count by (version)`` finds a straggler. Set once per service at start.
BUILD_INFO = Gauge(
    "sluice_build_info",
    "Always 1; the labels say which Sluice version (and Python) this service runs",
    ["service", "version", "python"],
)


def sluice_version() -> str:
    """The installed distribution's version ("unknown" when run from a tree that was never installed)."""
    try:
        return metadata.version("sluice")
    except metadata.PackageNotFoundError:
        return "unknown"


def set_build_info(service: str) -> None:
    """Export ``sluice_build_info{service, version, python} 1`` for ``service``."""
    BUILD_INFO.labels(service, sluice_version(), platform.python_version()).set(1)


def count_internal_error(service: str, method: str) -> None:
    """One request of ``service``'s ``method`` failed with an internal error."""
    INTERNAL_ERRORS.labels(service, method).inc()


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
                latency=MethodLatencies(f"{prefix}_rpc_duration_seconds"),
                errors=Counter(
                    f"{prefix}_rpc_errors",
                    "RPCs that ended in an error, by method and code",
                    ["method", "code"],
                ),
            )
            REGISTRY.register(m.latency)
            _cache[service] = m
        return m


class MethodRecorder:
    """The rate, latency and error series of one method, resolved once.

    Used by the interceptor for every call, and by stream handlers that carry many
    requests over one call (Broker.ProduceStream): each message is recorded under the
    unary method it stands for, so dashboards count requests however they travel.
    """

    __slots__ = ("_errors", "_latency", "_method", "_ok", "_requests")

    def __init__(self, service: str, method: str) -> None:
        metrics = rpc_metrics(service)
        self._method = method
        self._requests = metrics.requests
        self._errors = metrics.errors
        self._ok = metrics.requests.labels(method, "OK")
        self._latency = metrics.latency.labels(method)

    def record(self, code: str, started: float) -> None:
        """One request ended with ``code`` ("OK" or an error code name); ``started`` is perf_counter()."""
        self._latency.observe(time.perf_counter() - started)
        if code == "OK":
            self._ok.inc()
        else:
            self._requests.labels(self._method, code).inc()
            self._errors.labels(self._method, code).inc()
