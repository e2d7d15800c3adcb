"""``sluice broker``: run one broker process.

Opens (and recovers) every partition log under ``--data-dir``, serves the Broker gRPC service,
``/metrics`` and health, and, given ``--coordinator``, registers and heartbeats. SIGTERM or
Ctrl-C: parked fetches answer, in-flight produces finish, everything is fsynced and closed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from dataclasses import dataclass

from grpc import aio

from sluice.broker.config import ENV_PREFIX, BrokerConfig
from sluice.broker.controlled_shutdown import controlled_shutdown
from sluice.broker.coordinator_link import CoordinatorLink
from sluice.broker.epoch_reports import DamageReports, epoch_reports, log_reports
from sluice.broker.handlers import RequestHandlers
from sluice.broker.log.manager import LogManager
from sluice.broker.scrub import Scrubber
from sluice.broker.service import BrokerService
from sluice.broker.servicer import BrokerServicer
from sluice.broker.wire_server import broker_wire_listener
from sluice.common.timeouts import within
from sluice.quotas.poller import QuotaPoller
from sluice.security.setup import build as build_security
from sluice.server.config import add_arguments, load
from sluice.server.runtime import GrpcServer, serve, service_main, service_tls
from sluice.server.wire import WireListener
from sluice.v1 import broker_pb2_grpc

log = logging.getLogger(__name__)

#: How long start-up waits for the first registration before serving anyway.
REGISTRATION_WAIT_S = 10.0


@dataclass
class _BrokerGrpcServer(GrpcServer):
    """The gRPC server plus the wire listener; signals when both are bound, so registration
    can advertise the real ports."""

    wire: WireListener | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.started = asyncio.Event()

    async def start(self) -> int:
        port = await super().start()
        if self.wire is not None:
            await self.wire.start()
        self.started.set()
        return port

    def ready_line(self) -> str:
        line = super().ready_line()
        return line if self.wire is None else f"{line} wire={self.host}:{self.wire.bound_port}"


def parse_config(argv: list[str]) -> BrokerConfig:
    parser = argparse.ArgumentParser(
        prog="sluice broker",
        description="Run one Sluice broker: partition logs served over gRPC (Produce, Fetch, ListOffsets).",
    )
    add_arguments(parser, BrokerConfig)
    return load(BrokerConfig, ENV_PREFIX, parser.parse_args(argv))


def _coordinator_link(config: BrokerConfig, service: BrokerService, logs: LogManager) -> CoordinatorLink:
    """The broker's link to the controller: registration (with what an unclean restart left), heartbeats
    (with the epoch reports and the damage reads found, replication.md) and the updates it applies."""
    damage = DamageReports(logs)
    logs.on_damage = damage.found
    link = CoordinatorLink(
        config.coordinator,
        broker_id=config.broker_id,
        host=config.advertised,
        port=0,  # set once bound
        rack=config.rack,
        apply_update=service.update_partitions,
        metadata_version=lambda: service.metadata_version,
        controller_epoch=lambda: service.registry.epochs.controller_epoch,
        epoch_reports=lambda: epoch_reports(service.registry, service.leaders, config.broker_id),
        log_reports=lambda: log_reports(logs),
        unclean=logs.unclean,
        damaged=damage.take,
    )
    # A read may run off the event loop (a worker thread): the event is set on the loop.
    loop, found = asyncio.get_running_loop(), link.damage_found

    def wake() -> None:
        loop.call_soon_threadsafe(found.set)

    damage.wake = wake
    return link


async def run(config: BrokerConfig) -> None:
    """Serve until SIGTERM/SIGINT."""
    tls = service_tls(config)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    logs = LogManager(
        config.data_dir,
        config.log_defaults(),
        read_handles=config.segment_read_handles,
        descriptor_reserve=config.descriptor_reserve,
        min_free_bytes=config.storage_min_free_bytes,
    )
    logs.open_all()
    security = build_security("broker", config, config.coordinator)
    service = BrokerService(config, logs, authorizer=security.authorizer)
    service.metrics.disk_stats.source = lambda: [logs.space.stats()]
    await service.start()
    handlers = RequestHandlers(service)
    servicer = BrokerServicer(service, handlers)
    wire_port = config.wire_listen_port
    wire = None
    if wire_port is not None:
        wire = broker_wire_listener(handlers, config.host, wire_port, security, tls=tls)

    def register(server: aio.Server) -> None:
        broker_pb2_grpc.add_BrokerServicer_to_server(servicer, server)

    server = _BrokerGrpcServer(
        "broker",
        [register],
        host=config.host,
        port=config.port,
        metrics_port=config.metrics_port,
        wire=wire,
        security=security,
        tls=tls,
        metrics_tls=config.tls_metrics,
    )
    security.start()
    # Client quotas (docs/quotas.md): the coordinator's, kept current by long poll.
    quota_poller = QuotaPoller(config.coordinator, handlers.quotas) if config.coordinator else None
    if quota_poller is not None:
        quota_poller.start()
    link_task: asyncio.Task[None] | None = None
    link: CoordinatorLink | None = None
    if config.coordinator:
        link = _coordinator_link(config, service, logs)
        link_task = asyncio.create_task(_run_link(link, server, wire, config), name="coordinator-link")
    scrub_task = _start_scrub(config, service, logs)

    async def before_ready() -> None:
        # Announce readiness once registered, so a topic can be created right away;
        # a coordinator that is down must not keep the broker from serving.
        if link is not None:
            with contextlib.suppress(TimeoutError):
                await within(link.registered.wait(), REGISTRATION_WAIT_S)
        if quota_poller is not None:
            with contextlib.suppress(TimeoutError):
                await within(quota_poller.synced.wait(), REGISTRATION_WAIT_S)
        await security.wait_synced()

    shut_down = asyncio.Event()  # on_stop runs twice (serve's hook, then the finally below)

    async def on_stop() -> None:
        if link is not None and not shut_down.is_set():
            shut_down.set()
            # Still serving: the leaderships move away first (controlled_shutdown.py).
            await controlled_shutdown(
                link,
                lambda: len(service.leaders.states),
                service.updated,
                config.controlled_shutdown_timeout.total_seconds(),
            )
        if wire is not None:
            await wire.stop()
        if scrub_task is not None:
            scrub_task.cancel()
        if link_task is not None:
            link_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await link_task
        if quota_poller is not None:
            await quota_poller.stop()
        await security.stop()
        await service.stop()

    try:
        await serve(server, on_stop=on_stop, before_ready=before_ready)
    finally:
        await on_stop()  # idempotent; covers a failed start


def _start_scrub(config: BrokerConfig, service: BrokerService, logs: LogManager) -> asyncio.Task[None] | None:
    """The background scrub of sealed segments (scrub.py); None when ``--scrub-rate 0``."""
    if config.scrub_rate <= 0:
        return None
    metrics = service.metrics
    scrubber = Scrubber(
        logs,
        config.scrub_rate,
        config.scrub_interval.total_seconds(),
        on_bytes=metrics.scrub_bytes.inc,
        on_damage=metrics.scrub_damaged.inc,
    )
    return asyncio.create_task(scrubber.run(), name="scrub")


async def _run_link(
    link: CoordinatorLink, server: _BrokerGrpcServer, wire: WireListener | None, config: BrokerConfig
) -> None:
    await server.started.wait()
    link.port = config.advertised_port or server.bound_port
    link.wire_port = (config.advertised_wire_port or wire.bound_port) if wire is not None else 0
    await link.run()


def main(argv: list[str] | None = None) -> int:
    return service_main("broker", argv, parse_config, run)


if __name__ == "__main__":
    raise SystemExit(main())
