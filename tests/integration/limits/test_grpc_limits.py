"""HTTP/2 limits of the gRPC servers (docs/limits.md, "Connections"), on a real broker process: one
connection's streams are capped (Rapid Reset, CVE-2023-44487), the server's RPCs are capped, large
metadata is refused and idle connections are closed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.common.rpc import CHANNEL_OPTIONS
from tests.harness import ServiceProcess
from tests.integration.limits.conftest import metric, wait_for

Launch = Callable[..., ServiceProcess]


async def _answered(reads: list[asyncio.Future[object]], within: float) -> int:
    """How many of the pending first reads of Watch calls complete within ``within`` seconds."""
    done, _ = await asyncio.wait(reads, timeout=within)
    return sum(1 for r in done if not r.exception())


def test_one_connection_opening_thousands_of_streams_is_capped(launch: Launch) -> None:
    broker = launch("broker", "--grpc-max-concurrent-streams", "20")

    async def run() -> None:
        async with aio.insecure_channel(broker.address, options=CHANNEL_OPTIONS) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            # Watch streams stay open after their first answer: each holds a stream for good.
            calls = [stub.Watch(health_pb2.HealthCheckRequest()) for _ in range(2000)]
            reads = [asyncio.ensure_future(call.read()) for call in calls]
            served = await _answered(reads, within=10)
            assert served == 20, f"{served} streams served on one connection, the cap is 20"
            # The server stays healthy for every other client.
            # (A connection of its own: channels with the same target and options share one.)
            own = (*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1))
            async with aio.insecure_channel(broker.address, options=own) as other:
                started = time.monotonic()
                answer = await health_pb2_grpc.HealthStub(other).Check(
                    health_pb2.HealthCheckRequest(), timeout=10
                )
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
                assert time.monotonic() - started < 5
            # The streams past the cap waited (grpc's client queues them): ending 20 lets 20 more in.
            answered = [i for i, r in enumerate(reads) if r.done()]
            for i in answered:
                calls[i].cancel()
            waiting = [r for r in reads if not r.done()]
            served_next = await _answered(waiting, within=10)
            assert served_next == 20
            for call in calls:
                call.cancel()

    asyncio.run(run())


def test_rpcs_over_the_servers_cap_fail_resource_exhausted(launch: Launch) -> None:
    broker = launch("broker", "--grpc-max-concurrent-rpcs", "30")

    async def run() -> None:
        channels = [aio.insecure_channel(broker.address, options=CHANNEL_OPTIONS) for _ in range(2)]
        calls = [
            health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            for channel in channels
            for _ in range(20)
        ]
        codes = []
        for call in calls:
            try:
                await asyncio.wait_for(call.read(), 10)
                codes.append(grpc.StatusCode.OK)
            except aio.AioRpcError as err:
                codes.append(err.code())
        assert codes.count(grpc.StatusCode.OK) == 30
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 10
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close(None)

    asyncio.run(run())


def test_metadata_over_the_limit_is_refused(launch: Launch) -> None:
    broker = launch("broker", "--grpc-max-metadata-bytes", "4096")
    with grpc.insecure_channel(broker.address, options=CHANNEL_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stub.Check(health_pb2.HealthCheckRequest(), metadata=[("x-small", "a" * 1000)], timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Check(health_pb2.HealthCheckRequest(), metadata=[("x-large", "a" * 8000)], timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        stub.Check(health_pb2.HealthCheckRequest(), timeout=10)  # the connection goes on


def test_an_idle_grpc_connection_is_closed(launch: Launch) -> None:
    broker = launch("broker", "--connections-max-idle", "1s")
    with grpc.insecure_channel(broker.address, options=CHANNEL_OPTIONS) as channel:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert metric(broker, "sluice_broker_grpc_connections_open") == 1
        # A GOAWAY after a second without an RPC puts the channel back to IDLE (the client's own
        # idle timeout is 30 minutes); the next call connects again.
        deadline = time.monotonic() + 20
        while channel._channel.check_connectivity_state(False) != 0:  # type: ignore[attr-defined]  # 0: IDLE
            assert time.monotonic() < deadline, "the server kept an idle connection open"
            time.sleep(0.1)
        wait_for(lambda: metric(broker, "sluice_broker_grpc_connections_open") == 0, 10, "the gauge")
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
