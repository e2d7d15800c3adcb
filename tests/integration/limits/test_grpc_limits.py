"""HTTP/2 limits of the gRPC servers (docs/limits.md, "Connections"), on a real broker process: one
connection's streams are capped (Rapid Reset, CVE-2023-44487), the server's RPCs are capped, large
metadata is refused and idle connections are closed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.common.rpc import CHANNEL_OPTIONS, answered_error
from sluice.v1 import broker_pb2, broker_pb2_grpc
from tests.harness import ServiceProcess
from tests.integration.limits.conftest import metric, rss_bytes, wait_for
from tests.integration.limits.raw_h2 import ENHANCE_YOUR_CALM, RawH2

#: SETTINGS_MAX_CONCURRENT_STREAMS (RFC 9113, 6.5.2).
MAX_CONCURRENT_STREAMS = 0x3

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


# ---- a raw HTTP/2 client: what grpc's own clients never do (raw_h2.py) ----------------------------


def _healthy(sp: ServiceProcess) -> float:
    """Seconds another client (a connection of its own) takes to be answered."""
    own = (*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1))
    started = time.monotonic()
    with grpc.insecure_channel(sp.address, options=own) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    return time.monotonic() - started


def test_streams_past_the_cap_are_refused_to_a_client_that_ignores_it(launch: Launch) -> None:
    broker = launch("broker", "--grpc-max-concurrent-streams", "20")
    client = RawH2(broker.address)
    try:
        assert client.read_for(2).settings.get(MAX_CONCURRENT_STREAMS) == 20  # announced
        for _ in range(500):
            client.request("/grpc.health.v1.Health/Watch")  # streams that stay open
        seen = client.read_for(5)
        assert len(seen.answered) == 20
        assert len(seen.refused) == 480  # RST_STREAM REFUSED_STREAM, nothing run for them
        assert _healthy(broker) < 5
    finally:
        client.close()


def test_a_rapid_reset_flood_leaves_the_server_healthy(launch: Launch) -> None:
    broker = launch("broker", "--grpc-max-concurrent-streams", "20")
    client = RawH2(broker.address)
    try:
        client.read_for(1)
        baseline = rss_bytes(broker)
        # CVE-2023-44487: open a stream and reset it at once, 20,000 times, in large writes.
        batch = bytearray()
        for _ in range(20_000):
            stream = client.next_stream
            client.next_stream += 2
            batch += client.request_bytes(stream, "/grpc.health.v1.Health/Check") + client.reset_bytes(stream)
            if len(batch) > 64 * 1024:
                try:
                    client.sock.sendall(batch)
                except OSError:
                    break  # the server may end the connection: that is a defence too
                batch.clear()
        client.read_for(3)
        assert broker.process.poll() is None
        assert rss_bytes(broker) - baseline < 16 * 1024 * 1024
        assert _healthy(broker) < 5
    finally:
        client.close()


def test_a_client_flooding_pings_is_sent_away(launch: Launch) -> None:
    broker = launch("broker")  # defaults: pings 10 s apart at the closest, 2 strikes
    client = RawH2(broker.address)
    try:
        client.read_for(1)
        with contextlib.suppress(OSError):  # the server may close before the last ping
            for _ in range(20):
                client.ping()
                client.read_for(0.05)
        seen = client.read_for(5)
        assert seen.goaway is not None
        assert seen.goaway.error_code == ENHANCE_YOUR_CALM
        assert seen.goaway.additional_data == b"too_many_pings"
        assert _healthy(broker) < 5
    finally:
        client.close()


def test_one_address_is_capped_over_all_its_connections(launch: Launch) -> None:
    """grpc_max_rpcs_per_address (grpcio has no connection hook, so an address's calls and streams are
    counted over all its connections): 5 streams held on 5 connections leave no room for a sixth call
    from the same address, typed LIMIT_EXCEEDED; ending one lets calls in again."""
    broker = launch("broker", "--grpc-max-rpcs-per-address", "5")
    own = (*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1))  # a connection per channel

    async def call_once(channel: aio.Channel) -> tuple[grpc.StatusCode, str]:
        """One unary call: its status, and the Sluice error code its trailer carries ("" if none)."""
        stub = broker_pb2_grpc.BrokerStub(channel)
        try:
            await stub.ListOffsets(broker_pb2.ListOffsetsRequest(), timeout=5)
        except aio.AioRpcError as exc:
            typed = answered_error(exc)
            return exc.code(), typed.code_name if typed is not None else ""
        return grpc.StatusCode.OK, ""

    async def until(channel: aio.Channel, wanted: grpc.StatusCode) -> str:
        deadline = time.monotonic() + 20
        while (answer := await call_once(channel))[0] != wanted:
            assert time.monotonic() < deadline, f"still {answer}, waiting for {wanted}"
            await asyncio.sleep(0.1)
        return answer[1]

    async def run() -> None:
        channels = [aio.insecure_channel(broker.address, options=own) for _ in range(6)]
        try:
            # Held open with nothing sent (grpc.aio's stream calls take their requests by write()).
            streams = [broker_pb2_grpc.BrokerStub(c).ProduceStream() for c in channels[:5]]  # type: ignore[call-arg]
            refused = await until(channels[5], grpc.StatusCode.RESOURCE_EXHAUSTED)  # all five run
            assert refused == "LIMIT_EXCEEDED"
            streams[0].cancel()
            await until(channels[5], grpc.StatusCode.OK)
            for stream in streams:
                stream.cancel()
        finally:
            for channel in channels:
                await channel.close(None)

    asyncio.run(run())
