"""Process limits every Sluice process sets at start-up (the open-files limit), and the connection
limits of its listeners (the settings in force, gRPC's options, the listeners' metrics).

Linux gives a process two limits on its descriptors (``RLIMIT_NOFILE``): a soft one, which
is what ``open``/``accept`` are held to, and a hard one, the ceiling an unprivileged process
may raise its soft limit to. Distributions and container runtimes commonly start processes
with soft 1,024 and a much higher hard limit (systemd: 524,288; Docker: 1,048,576). A broker
holds one descriptor per partition plus its connections, so at soft 1,024 it ran out at a
few hundred partitions (issue 20). Raising the soft limit to the hard one costs nothing
(the kernel allocates the descriptor table as it grows) and is what Kafka's install guide
asks operators to do by hand; every Sluice service does it itself, at start-up, and logs
both numbers so an operator sees the ceiling without a shell in the container.

Raising the hard limit needs privileges (``CAP_SYS_RESOURCE``): that stays the job of the
deployment (``ulimit -Hn``, systemd ``LimitNOFILE=``, Docker ``--ulimit nofile=``, the
chart's notes). See docs/kubernetes.md.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import resource
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily

from sluice.server.config import ConnectionSettings

log = logging.getLogger(__name__)

#: Linux's per-process ceiling when the hard limit is "unlimited" (setrlimit refuses more).
_NR_OPEN = Path("/proc/sys/fs/nr_open")
#: Used when the hard limit is unlimited and ``nr_open`` cannot be read (not Linux).
_FALLBACK_CEILING = 1 << 20


@dataclass(frozen=True, slots=True)
class OpenFilesLimit:
    """The process's ``RLIMIT_NOFILE`` after start-up."""

    #: The soft limit before this process raised it.
    before: int
    #: The soft limit now: what opens and accepts are held to.
    soft: int
    #: The hard limit: the most the soft limit could be raised to.
    hard: int


def _ceiling(hard: int) -> int:
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        return int(_NR_OPEN.read_text())
    except (OSError, ValueError):
        return _FALLBACK_CEILING


def raise_open_files_limit() -> OpenFilesLimit:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit and log both; never fails.

    A limit that cannot be raised (a platform that refuses) is logged as a warning and the
    process runs with what it has: the broker then answers a typed error when it runs out,
    rather than not starting.
    """
    before, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling(hard)
    soft = before
    if before == resource.RLIM_INFINITY or before >= target:
        log.info("open files limit: soft %d, hard %d (already at the hard limit)", before, hard)
        return OpenFilesLimit(before, before, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    except (ValueError, OSError) as exc:
        log.warning(
            "open files limit: soft %d, hard %d; could not raise the soft limit: %s", before, hard, exc
        )
        return OpenFilesLimit(before, before, hard)
    log.info("open files limit: soft %d raised to %d (the hard limit is %d)", before, soft, hard)
    return OpenFilesLimit(before, soft, hard)


def open_files_soft_limit() -> int:
    """The soft limit in force now (``RLIM_INFINITY`` reported as the kernel's ceiling)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return _ceiling(soft)


# ---- connection limits: the settings in force, gRPC's options, the listeners' metrics --------------

_settings: ConnectionSettings | None = None


def set_connection_settings(settings: object) -> None:
    """Make a service's config the limits of every listener this process starts (``service_tls``
    calls it with the config, as it sets the process's security): a config without connection
    settings leaves the defaults. InvalidArgument for settings no listener can run with."""
    global _settings
    if isinstance(settings, ConnectionSettings):
        settings.check_connection_settings()
        _settings = settings


def connection_settings() -> ConnectionSettings:
    """The limits in force: the service's config, or the defaults (a listener made by a test)."""
    return _settings if _settings is not None else ConnectionSettings()


def _ms(span: timedelta) -> int:
    return max(1, int(span.total_seconds() * 1000))


def grpc_server_options(s: ConnectionSettings) -> tuple[tuple[str, int], ...]:
    """The gRPC server's channel arguments for ``s`` (grpc core's names, ``grpc_types.h``)."""
    return (
        ("grpc.max_send_message_length", s.max_frame_bytes),
        ("grpc.max_receive_message_length", s.max_frame_bytes),
        ("grpc.so_reuseport", 0),
        # Identity only: no gzip/deflate message decompression. gRPC inflates a compressed message up to
        # max_receive_message_length before refusing it, so a 1 MB gzip of zeros cost 64 MiB per
        # concurrent stream; with only identity enabled it is refused (UNIMPLEMENTED) before any byte is
        # inflated. Sluice's clients never compress (docs/limits.md, "Decompression").
        ("grpc.compression_enabled_algorithms_bitset", 1),
        # One connection's streams: what a client may run at once. Without it a single connection
        # bypasses every connection cap (HTTP/2 Rapid Reset, CVE-2023-44487).
        ("grpc.max_concurrent_streams", s.grpc_max_concurrent_streams),
        ("grpc.max_allowed_incoming_connections", s.max_connections),
        # Soft and hard limit alike: between the two grpc core rejects at random.
        ("grpc.max_metadata_size", s.grpc_max_metadata_bytes),
        ("grpc.absolute_max_metadata_size", s.grpc_max_metadata_bytes),
        ("grpc.max_connection_idle_ms", _ms(s.connections_max_idle)),
        # The server's own pings: a client gone without a FIN frees its streams.
        ("grpc.keepalive_time_ms", _ms(s.keepalive_time)),
        ("grpc.keepalive_timeout_ms", _ms(s.keepalive_timeout)),
        ("grpc.http2.max_pings_without_data", 0),
        # Policing the clients' pings: the SDK pings idle channels (``common/rpc.py``), so pings
        # without calls are allowed, but not closer together than the minimum interval.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", _ms(s.keepalive_min_ping_interval)),
        ("grpc.http2.max_ping_strikes", s.keepalive_max_ping_strikes),
    )


#: Why a listener closed a connection (the ``reason`` label of ``..._connections_closed_total``).
CLOSE_REASONS = (
    "idle",  # nothing in flight and nothing received for connections_max_idle
    "pre_auth_timeout",  # no hello within hello_timeout
    "pre_auth_too_large",  # a first frame larger than max_hello_bytes
    "frame_timeout",  # a frame begun and not complete within frame_timeout (slowloris)
    "too_large",  # a frame larger than max_frame_bytes
    "limit",  # max_connections or max_connections_per_address reached
    "half_frame",  # the peer half-closed in the middle of a frame: it can never complete
    "protocol",  # any other broken frame (unknown type, no hello first, does not parse)
)


@dataclass(frozen=True, slots=True)
class ListenerMetrics:
    """``sluice_<service>_connections_open{listener}`` (every accepted connection, before the hello
    too) and ``sluice_<service>_connections_closed_total{listener, reason}`` (closed by the service,
    by why; a peer that closes is not counted)."""

    open: Gauge
    closed: Counter

    def closed_for(self, reason: str) -> None:
        self.closed.labels(reason).inc()


_METRICS: dict[tuple[str, str], ListenerMetrics] = {}


def listener_metrics(service: str, listener: str) -> ListenerMetrics:
    """One per service, listener kind and process (the default registry)."""
    key = (service, listener)
    metrics = _METRICS.get(key)
    if metrics is None:
        prefix = f"sluice_{service.replace('-', '_')}_{listener}"
        metrics = _METRICS[key] = ListenerMetrics(
            Gauge(f"{prefix}_connections_open", f"Open {listener} connections, before the hello too"),
            Counter(
                f"{prefix}_connections_closed",
                f"{listener} connections the service closed, by reason",
                ["reason"],
            ),
        )
        for reason in CLOSE_REASONS:
            metrics.closed.labels(reason)  # every series exists from the start, at 0
    return metrics


def set_tcp_keepalive(sock: Any, s: ConnectionSettings) -> None:
    """TCP keepalive on an accepted wire socket: a peer that vanished without a FIN (power loss, a
    dropped NAT entry) is found even while the connection has work in flight and is exempt from the
    idle timeout. Best effort: a platform without the options keeps the connection as it is."""
    if sock is None:
        return
    idle = max(1, int(s.keepalive_time.total_seconds()))
    interval = max(1, int(s.keepalive_timeout.total_seconds()) // 3)
    with contextlib.suppress(OSError, AttributeError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


class _GrpcConnections:
    """``sluice_<service>_grpc_connections_open``: the gRPC server's open connections, read from
    grpc core's channelz at scrape time (grpcio exposes no connection events to Python, so this
    count, not a count of closes by reason, is what the gRPC listener reports). Summed over the
    process's servers: a service runs one. Private API of grpcio: if it changes, the gauge is absent
    and nothing else breaks."""

    def __init__(self, service: str) -> None:
        self.name = f"sluice_{service.replace('-', '_')}_grpc_connections_open"

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.name, "Open gRPC connections (HTTP/2 transports)")]

    def collect(self) -> list[GaugeMetricFamily]:
        count = grpc_connections()
        if count is None:
            return []
        return [GaugeMetricFamily(self.name, "Open gRPC connections (HTTP/2 transports)", value=count)]


#: Pages of channelz socket references; one scrape reads ``open / page`` of them.
_CHANNELZ_PAGE = 1000


def grpc_connections() -> int | None:
    """Open connections of this process's gRPC servers (None: channelz unavailable)."""
    try:
        cygrpc: Any = importlib.import_module("grpc._cython.cygrpc")  # private: it may go

        servers: Any = json.loads(cygrpc.channelz_get_servers(0))
        total = 0
        for server in servers.get("server", ()):
            server_id = int(server["ref"]["serverId"])
            start = 0
            while True:
                page: Any = json.loads(cygrpc.channelz_get_server_sockets(server_id, start, _CHANNELZ_PAGE))
                refs = page.get("socketRef", [])
                total += len(refs)
                if page.get("end", True) or not refs:
                    break
                start = int(refs[-1]["socketId"]) + 1
        return total
    except Exception:  # a changed private API: no gauge rather than a failed scrape
        return None


_GRPC_COLLECTORS: set[str] = set()


def register_grpc_connections(service: str) -> None:
    """Export the gRPC connection gauge of ``service`` (once per process)."""
    if service not in _GRPC_COLLECTORS:
        _GRPC_COLLECTORS.add(service)
        REGISTRY.register(_GrpcConnections(service))
