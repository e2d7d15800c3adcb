"""``sluice offset-store``: group offsets and push cursors over gRPC, kept in Redis."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging

from sluice.common.redis_client import connect, noeviction_guard
from sluice.errors import InvalidArgument, SluiceError, StorageError
from sluice.offsetstore.config import ENV_PREFIX, OffsetStoreConfig
from sluice.offsetstore.keys import Keys
from sluice.offsetstore.resolver import BrokerOffsetResolver
from sluice.offsetstore.service import OffsetStoreService
from sluice.offsetstore.servicer import OffsetStoreServicer
from sluice.offsetstore.storage import PositionStore, ReplicaWait
from sluice.security.setup import build as build_security
from sluice.server.config import add_arguments, load
from sluice.server.embedded import request_stop
from sluice.server.runtime import GrpcServer, serve, service_main, service_tls
from sluice.v1 import offset_store_pb2_grpc

log = logging.getLogger(__name__)

SERVICE = "offset-store"
HEALTH_NAME = "sluice.v1.OffsetStore"


def parse_config(argv: list[str] | None) -> OffsetStoreConfig:
    parser = argparse.ArgumentParser(
        prog="sluice offset-store",
        description="Committed offsets of consumer groups and cursors of push subscriptions, in Redis.",
    )
    add_arguments(parser, OffsetStoreConfig)
    config = load(OffsetStoreConfig, ENV_PREFIX, parser.parse_args(argv))
    if not config.redis_url:
        raise InvalidArgument(f"--redis-url (or {ENV_PREFIX}REDIS_URL) is required")
    if not config.key_prefix or any(c in config.key_prefix for c in "{} "):
        raise InvalidArgument(
            f"--key-prefix {config.key_prefix!r} must be non-empty, without braces or spaces"
        )
    if not 0 <= config.commit_replicas <= 16:
        raise InvalidArgument(f"--commit-replicas must be in [0, 16], got {config.commit_replicas}")
    if not 1 <= config.commit_replicas_timeout_ms <= 60_000:
        raise InvalidArgument(
            f"--commit-replicas-timeout-ms must be in [1, 60000], got {config.commit_replicas_timeout_ms}"
        )
    return config


async def run(config: OffsetStoreConfig) -> None:
    tls = service_tls(config)
    # No command retry in redis-py (retries=0): a commit whose answer is lost must be reported in doubt,
    # and a retry that then failed to connect would make it look never sent. The SDK retries instead.
    client = connect(config.redis_url, retries=0)
    refused: list[SluiceError] = []

    def refuse(err: SluiceError) -> None:
        # The policy could only be checked once Redis answered: stop as a refused start-up would (exit 1).
        log.error("offset-store refuses to run: %s", err.message)
        refused.append(err)
        request_stop()

    try:
        policy_check = await noeviction_guard(client, SERVICE, refuse)
    except SluiceError:
        await client.aclose()
        raise
    store = PositionStore(
        client,
        Keys(config.key_prefix),
        ReplicaWait(config.commit_replicas, config.commit_replicas_timeout_ms),
    )
    try:
        await store.load_scripts()
    except StorageError as exc:
        # Not fatal: requests fail with STORAGE_ERROR until Redis is back, and
        # the scripts load on first use.
        log.warning("Redis is not reachable yet (%s); serving anyway", exc)
    resolver = BrokerOffsetResolver(config.coordinator) if config.coordinator else None
    service = OffsetStoreService(store, resolver)
    servicer = OffsetStoreServicer(service)
    security = build_security(SERVICE, config, config.coordinator)
    server = GrpcServer(
        SERVICE,
        [lambda s: offset_store_pb2_grpc.add_OffsetStoreServicer_to_server(servicer, s)],
        host=config.host,
        port=config.port,
        metrics_port=config.metrics_port,
        health_names=[HEALTH_NAME],
        security=security,
        tls=tls,
        metrics_tls=config.tls_metrics,
    )
    security.start()
    try:
        await serve(server, before_ready=security.wait_synced)
    finally:
        if policy_check is not None:
            policy_check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await policy_check
        await security.stop()
        await service.close()
    if refused:
        raise refused[0]


def main(argv: list[str] | None = None) -> int:
    return service_main("offset-store", argv, parse_config, run)
