"""``sluice coordinator``: run the coordinator service until SIGTERM/SIGINT.

Startup: connect to Redis, take the writer epoch (fencing older coordinators), rebuild the state from the
stored records, then serve gRPC (+ health) and /metrics and print the ready line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket

from sluice.common.redis_client import connect as connect_redis
from sluice.common.redis_client import noeviction_guard, wait_for_redis
from sluice.common.timeouts import within
from sluice.coordinator.acl_servicer import AclServicer, acl_registrar
from sluice.coordinator.acl_store import AclStore
from sluice.coordinator.auth_servicer import SERVICE_NAME as AUTH_SERVICE_NAME
from sluice.coordinator.auth_servicer import AuthService
from sluice.coordinator.cluster.model import Endpoint
from sluice.coordinator.config import ENV_PREFIX, CoordinatorConfig
from sluice.coordinator.election import CoordinatorElection, ElectingGrpcServer
from sluice.coordinator.quota_servicer import QuotaServicer, quota_registrar
from sluice.coordinator.quota_store import QuotaStore
from sluice.coordinator.service import CoordinatorService
from sluice.coordinator.servicer import SERVICE_NAME, registrar
from sluice.errors import SluiceError
from sluice.security.context import current
from sluice.security.model import Principal
from sluice.security.setup import build as build_security
from sluice.server.config import add_arguments, load
from sluice.server.embedded import request_stop
from sluice.server.runtime import GrpcServer, serve, service_main, service_tls

log = logging.getLogger("sluice.coordinator")

_WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def advertised_host(config: CoordinatorConfig) -> str:
    if config.advertised_host:
        return config.advertised_host
    if config.host in _WILDCARDS:
        return socket.gethostname()
    return config.host


async def run(config: CoordinatorConfig) -> None:
    tls = service_tls(config)
    # No command retry here (retries=0): the election's lease renewals must see a failure at once;
    # a Sentinel-managed primary is found again on the next command all the same.
    redis = connect_redis(config.redis_url, socket_timeout=5, connect_timeout=5, retries=0)
    refused: list[SluiceError] = []

    def refuse(err: SluiceError) -> None:
        # The policy could only be checked once Redis answered: stop as a refused start-up would (exit 1).
        log.error("coordinator refuses to run: %s", err.message)
        refused.append(err)
        request_stop()

    try:
        # docs/offset-store.md, "When Redis is down or slow": eviction would delete metadata and offsets.
        policy_check = await noeviction_guard(redis, "coordinator", refuse)
    except SluiceError:
        await redis.aclose()
        raise
    server: GrpcServer | None = None

    def coordinator_endpoint() -> Endpoint | None:
        if server is None or server.bound_port == 0:
            return None
        return Endpoint(advertised_host(config), server.bound_port)

    # With an election the server starts as a standby and the service starts when elected (wiring.py).
    election = CoordinatorElection.from_config(config, redis)
    service = CoordinatorService.from_config(config, redis, coordinator_endpoint, election)
    # Logins and users (auth_servicer.py): on every replica, standbys too.
    auth = AuthService.from_config(config, redis)
    security = build_security("coordinator", config, sessions=auth.tokens)
    acl_store = AclStore(redis, config.key_prefix)
    acls = AclServicer(
        acl_store, service, user_generations=auth.users.all_generations, principal_of=_principal
    )
    quotas = QuotaServicer(QuotaStore(redis, config.key_prefix), service, principal_of=_principal)
    # A user's change moves the security version on, so every service's watcher brings the new
    # generations (and ends the sessions of a deleted user or a changed password).
    auth.users.on_change(lambda: _bump_security(acl_store, service, acls))

    async def stop() -> None:
        await security.stop()
        acls.close()  # answer the waiting security polls now
        quotas.close()
        if election is not None:
            await election.close()  # resign: a standby takes over without waiting out the lease
        await service.close()

    elected = asyncio.Event()

    async def on_elected(epoch: int) -> None:
        await service.start(epoch)
        elected.set()

    async def before_ready() -> None:
        # Announce readiness once this replica leads, so `sluice up` and tests can use it at once.
        # A standby (another replica leads) stops waiting after two lease periods and serves as one.
        if election is not None:
            with contextlib.suppress(TimeoutError):
                await within(elected.wait(), 2 * config.lease_duration.total_seconds())
        # The coordinator decides from the same snapshots as every service: it follows its own
        # address (a standby is sent on to the leader), so there is one way ACLs reach a decision.
        if server is not None:
            security.watch(
                f"127.0.0.1:{server.bound_port}" if config.host in ("0.0.0.0", "::") else server.address
            )
            security.start()
            await security.wait_synced()

    try:
        if election is None:
            # Redis down at start-up: wait for it (a few warnings) rather than exit and be restarted in
            # a loop; with an election the elector waits the same way (election/loop.py).
            await wait_for_redis(redis, "coordinator")
            await service.start()
        else:
            election.attach(on_elected=on_elected, on_lost=service.step_down)
        server = ElectingGrpcServer(
            service="coordinator",
            registrars=[registrar(service), acl_registrar(acls), auth.registrar(), quota_registrar(quotas)],
            host=config.host,
            port=config.port,
            metrics_port=config.metrics_port,
            health_names=[SERVICE_NAME, AUTH_SERVICE_NAME],
            tls=tls,
            metrics_tls=config.tls_metrics,
            election=election,
            advertised_host=advertised_host(config),
            security=security,
        )
        await serve(server, on_stop=stop, before_ready=before_ready)
    finally:
        if policy_check is not None:
            policy_check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await policy_check
        await stop()
        await redis.aclose()
    if refused:
        raise refused[0]


def parse_config(argv: list[str]) -> CoordinatorConfig:
    parser = argparse.ArgumentParser(
        prog="sluice coordinator",
        description="Run the Sluice coordinator: cluster metadata (brokers, topics, placement) in Redis. "
        f"Every flag can also be set as {ENV_PREFIX}<FLAG> or in a TOML file (--config).",
    )
    add_arguments(parser, CoordinatorConfig)
    return load(CoordinatorConfig, ENV_PREFIX, parser.parse_args(argv)).validate()


def main(argv: list[str] | None = None) -> int:
    return service_main("coordinator", argv, parse_config, run)


if __name__ == "__main__":
    raise SystemExit(main())


def _principal(_context: object) -> Principal:
    """Who made an ACL change, for the audit log: the current call's principal."""
    return current().principal


_BUMPS: set[asyncio.Task[None]] = set()


def _bump_security(store: AclStore, service: CoordinatorService, acls: AclServicer) -> None:
    """After a user change (a sync listener): bump the security version, then wake the polls."""

    async def bump() -> None:
        try:
            await store.bump_version(service.epoch)
        except SluiceError as err:
            log.warning("a user changed but the security version could not move on: %s", err.message)
            return
        acls.notify_changed()

    task = asyncio.get_running_loop().create_task(bump(), name="security-version-bump")
    _BUMPS.add(task)  # held until done: the loop keeps only weak references to tasks
    task.add_done_callback(_BUMPS.discard)
