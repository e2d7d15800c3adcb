"""Start, report, and gracefully stop one service's gRPC server.

Every service process runs through :func:`serve`:

1. build the ``grpc.aio`` server with the interceptor chain and the standard
   health service;
2. bind (port 0 in tests) and report the real port: TLS when the service has a certificate
   (``sluice.security.tls``, reloaded from its files), else plaintext;
3. serve ``/metrics`` and ``/healthz`` over HTTP (``sluice.server.http``; the probes' way in when
   the gRPC port is TLS-only);
4. print one ready line, ``SLUICE_READY service=<name> address=<host:port>
   metrics=<host:port>``, which ``sluice up`` and the test harness wait for;
5. on SIGTERM/SIGINT: mark health NOT_SERVING, run the service's own stop hook
   (a broker flushes), then stop the server within the grace period.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIServer

from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sluice.codec.filter_limits import set_filter_limits
from sluice.common.client_security import set_process_security
from sluice.errors import InvalidArgument, SluiceError
from sluice.security.service import ServiceSecurity
from sluice.security.settings import SecuritySettings
from sluice.security.setup import service_security
from sluice.security.tls import ServerTLS, server_tls
from sluice.server.config import ConnectionSettings, FilterSettings
from sluice.server.embedded import current_host, say
from sluice.server.http import start_http
from sluice.server.interceptors import ServiceInterceptor
from sluice.server.limits import (
    connection_settings,
    grpc_server_options,
    raise_open_files_limit,
    register_grpc_connections,
    set_connection_settings,
)
from sluice.server.metrics import set_build_info
from sluice.server.pauses import tune_gc, watch_pauses

log = logging.getLogger(__name__)


Registrar = Callable[[aio.Server], None]


@dataclass
class GrpcServer:
    """One service's gRPC server. ``start()`` returns; ``stop()`` is idempotent."""

    service: str
    registrars: list[Registrar]
    host: str = "127.0.0.1"
    port: int = 0
    metrics_port: int | None = 0
    security: ServiceSecurity | None = None
    health_names: list[str] = field(default_factory=list)
    #: TLS on the gRPC port (None: plaintext); ``metrics_tls`` also on the HTTP port.
    tls: ServerTLS | None = None
    metrics_tls: bool = False
    #: The listener's limits (None: the process's, ``connection_settings()``; docs/limits.md).
    limits: ConnectionSettings | None = None

    def __post_init__(self) -> None:
        self._server: aio.Server | None = None
        self._health = health.aio.HealthServicer()  # type: ignore[attr-defined]  # missing from the stubs
        self._metrics_server: WSGIServer | None = None
        self._stopped = asyncio.Event()
        self.bound_port = 0
        self.bound_metrics_port = 0
        self.serving = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.bound_port}"

    async def start(self) -> int:
        limits = self.limits if self.limits is not None else connection_settings()
        server = aio.server(
            interceptors=[ServiceInterceptor(self.service, self.security)],
            options=grpc_server_options(limits),
            # Over all connections: past it a call fails RESOURCE_EXHAUSTED at once, before a
            # handler (and its memory) exists.
            maximum_concurrent_rpcs=limits.grpc_max_concurrent_rpcs,
        )
        for register in self.registrars:
            register(server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        bind = f"{self.host}:{self.port}"
        try:
            if self.tls is None:
                self.bound_port = server.add_insecure_port(bind)
            else:
                self.bound_port = server.add_secure_port(bind, self.tls.grpc_credentials())
        except RuntimeError:  # grpcio >= 1.60 raises where older releases returned 0
            self.bound_port = 0
        if self.bound_port == 0:
            raise OSError(
                f"{self.service}: could not bind {bind} (address in use, or not an address of this host)"
            )
        await server.start()
        self._server = server
        register_grpc_connections(self.service)
        set_build_info(self.service)
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        if self.metrics_port is not None:
            http_tls = self.tls if self.metrics_tls else None
            httpd = start_http(self.host, self.metrics_port, lambda: self.serving, http_tls)
            self._metrics_server = httpd
            self.bound_metrics_port = httpd.server_port
        return self.bound_port

    async def _set_health(self, status: int) -> None:
        self.serving = status == health_pb2.HealthCheckResponse.SERVING
        for name in ("", *self.health_names):
            await self._health.set(name, status)

    def ready_line(self) -> str:
        metrics = f"{self.host}:{self.bound_metrics_port}" if self._metrics_server else "-"
        return f"SLUICE_READY service={self.service} address={self.address} metrics={metrics}"

    async def stop(self, grace: float = 5.0) -> None:
        if self._server is None or self._stopped.is_set():
            return
        self._stopped.set()
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._server.stop(grace)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()
        if self._server is not None:
            await self._server.wait_for_termination()


StopHook = Callable[[], Awaitable[None]]


def service_tls(settings: SecuritySettings) -> ServerTLS | None:
    """The first thing a service's ``run`` does (before it makes any peer channel): sets how this
    process calls the other services (``set_process_security``: its CA, its certificate for mTLS,
    the cluster token), makes the config's connection limits those of every listener it starts
    (``sluice.server.limits``) and its filter limits those of every parse (``codec/filter_limits``), and
    returns the TLS of its own listeners (None: plaintext)."""
    set_connection_settings(settings)
    if isinstance(settings, FilterSettings):
        set_filter_limits(settings.filter_limits())  # before any filter is parsed (and cached)
    set_process_security(service_security(settings))
    return server_tls(settings)


async def serve(
    server: GrpcServer,
    on_stop: StopHook | None = None,
    grace: float = 5.0,
    before_ready: StopHook | None = None,
) -> None:
    """Run ``server`` until SIGTERM/SIGINT, then stop it gracefully.

    ``before_ready`` runs once the server is bound and before the ready line, for
    services that are only useful once they announced themselves (a broker that
    registered with the coordinator).
    """
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    host = current_host()
    if host is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop_requested.set)
    else:  # one of several services in this process: its launcher owns the signals
        host.on_stop(lambda: loop.call_soon_threadsafe(stop_requested.set))
    await server.start()
    if before_ready is not None:
        await before_ready()
    # Everything allocated at start-up (modules, protobuf descriptors, the loaded logs'
    # indexes) lives as long as the process: move it out of the collector's reach, so a
    # full collection scans only what requests allocate and its pause stays short.
    gc.freeze()
    tune_gc()
    watch_pauses(server.service)
    say(server.ready_line())
    log.info("%s serving on %s", server.service, server.address)
    await stop_requested.wait()
    log.info("%s stopping", server.service)
    # Refuse new work first (health NOT_SERVING), then let the service wind
    # down its own state, then drain in-flight RPCs.
    try:
        if on_stop is not None:
            await on_stop()
    finally:
        await server.stop(grace)
    if host is None:
        print(f"SLUICE_STOPPED service={server.service}", file=sys.stderr, flush=True)
    else:
        host.say(f"SLUICE_STOPPED service={server.service}")


def configure_logging(level: str = "INFO") -> None:
    """The start-up of every service process (``service_main`` and the coordinator's main call
    it before anything else): configure logging, then raise the open-files limit to the hard
    limit and log both (``sluice.server.limits``), before a broker opens its logs."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    raise_open_files_limit()


#: ``SLUICE_EVENT_LOOP=asyncio`` runs a service on the standard library's loop instead of uvloop.
EVENT_LOOP_ENV = "SLUICE_EVENT_LOOP"


def event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    """How services run their main coroutine: on uvloop when it is installed (the default), else
    on asyncio's own loop.

    Why uvloop: a record costs every service a few socket reads and writes, and on the wire
    protocol (docs/wire.md) asyncio's Python-level selector and transports were a large part of
    that; libuv's are C. Measured at 2,000 records/s (bench/e2e_latency.py, push_throughput.py):
    broker CPU per record 350 -> 300 us, dispatcher 250 -> 200 us, push p99 6.2 -> 3.3 ms.
    """
    choice = os.environ.get(EVENT_LOOP_ENV, "uvloop").strip().lower()
    if choice not in ("uvloop", "asyncio"):
        raise InvalidArgument(f"{EVENT_LOOP_ENV} must be uvloop or asyncio, got {choice!r}")
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.info("uvloop is not installed: running on asyncio's event loop")
        else:
            return uvloop.run
    return asyncio.run


def service_main(
    name: str,
    argv: list[str] | None,
    parse_config: Callable[[list[str]], Any],
    run: Callable[[Any], Coroutine[Any, Any, None]],
) -> int:
    """The body of every ``sluice <service>`` command: parse the config (a bad one
    exits 2 with its message), configure logging, serve until signalled (a fatal
    error exits 1, logged, never a traceback)."""
    try:
        config = parse_config(list(sys.argv[1:] if argv is None else argv))
    except SluiceError as err:
        print(f"sluice {name}: {err.message}", file=sys.stderr)
        return 2
    configure_logging(config.log_level)
    try:
        event_loop_runner()(run(config))
    except (SluiceError, OSError) as err:
        log.error("%s failed: %s", name, err)
        return 1
    return 0
