"""``sluice dispatcher``: run one dispatcher process.

Serves the Dispatcher gRPC service (Consume streams, ListSubscriptions, DescribeSubscription),
``/metrics`` and health; registers with ``--coordinator`` and learns brokers, the offset store and
partition routing from its Metadata. SIGTERM or Ctrl-C: streams end, every durable cursor is written
to the offset store, feeds stop.
"""

from __future__ import annotations

import argparse
import gc
import logging

from grpc import aio

from sluice.common.memory import tune_allocator
from sluice.common.wire import wire_listen_port
from sluice.dispatcher.config import ENV_PREFIX, DispatcherConfig
from sluice.dispatcher.metrics import dispatcher_metrics
from sluice.dispatcher.service import DispatcherService
from sluice.dispatcher.servicer import DispatcherServicer, add_to_server
from sluice.dispatcher.wire_server import dispatcher_wire_listener
from sluice.quotas.poller import QuotaPoller
from sluice.security.setup import build as build_security
from sluice.server.config import add_arguments, load
from sluice.server.runtime import GrpcServer, serve, service_main, service_tls
from sluice.server.wire import WireListener

log = logging.getLogger(__name__)

#: Generation-0 threshold of the cyclic GC. The dispatcher makes a few small objects per record it
#: reads (freed by reference counting: messages hold no cycles), so with the default of 700 the
#: collector ran every few hundred records and walked the young messages each time: ~3 % of the
#: dispatcher's CPU per record in bench/push_throughput.py. At 10,000 a young collection takes about
#: a millisecond here (measured 1.3-3.7 ms at 22,000 young objects), rare enough for latency.
GC_GEN0_THRESHOLD = 10_000


class _DispatcherGrpcServer(GrpcServer):
    """The gRPC server plus the wire listener; starts the coordinator link once both are bound, so
    registration advertises the real ports."""

    service_ref: DispatcherService | None = None
    advertised_host: str = ""
    wire: WireListener | None = None

    async def start(self) -> int:
        port = await super().start()
        wire_port = await self.wire.start() if self.wire is not None else 0
        if self.service_ref is not None:
            self.service_ref.start(self.advertised_host, port, wire_port)
        return port

    def ready_line(self) -> str:
        line = super().ready_line()
        return line if self.wire is None else f"{line} wire={self.host}:{self.wire.bound_port}"


def parse_config(argv: list[str]) -> DispatcherConfig:
    parser = argparse.ArgumentParser(
        prog="sluice dispatcher",
        description="Run one Sluice dispatcher: push subscriptions (Exclusive, Shared, Failover, Key_Shared)",
    )
    add_arguments(parser, DispatcherConfig)
    return load(DispatcherConfig, ENV_PREFIX, parser.parse_args(argv))


async def run(config: DispatcherConfig) -> None:
    tls = service_tls(config)
    gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
    gc.freeze()  # what startup made lives forever: later collections need not walk it
    security = build_security("dispatcher", config, config.coordinator)
    service = DispatcherService(config, dispatcher_metrics(), authorizer=security.authorizer)
    servicer = DispatcherServicer(service)

    def register(server: aio.Server) -> None:
        add_to_server(servicer, server)

    server = _DispatcherGrpcServer(
        "dispatcher",
        [register],
        host=config.host,
        port=config.port,
        metrics_port=config.metrics_port,
        security=security,
        tls=tls,
        metrics_tls=config.tls_metrics,
    )
    security.start()
    quota_poller = QuotaPoller(config.coordinator, service.quotas)  # docs/quotas.md
    quota_poller.start()
    server.service_ref = service
    server.advertised_host = config.advertised
    wire_port = wire_listen_port(config.port, config.wire_port)
    if wire_port is not None:
        server.wire = dispatcher_wire_listener(servicer, config.host, wire_port, security, tls=tls)
    stopped = False

    async def on_stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            if server.wire is not None:
                await server.wire.stop()
            await quota_poller.stop()
            await security.stop()
            await service.stop()

    try:
        await serve(server, on_stop=on_stop, before_ready=security.wait_synced)
    finally:
        await on_stop()


def main(argv: list[str] | None = None) -> int:
    tune_allocator()  # before any thread: docs/memory.md, "Dispatcher"
    return service_main("dispatcher", argv, parse_config, run)


if __name__ == "__main__":
    raise SystemExit(main())
