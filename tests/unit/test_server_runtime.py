"""The shared server bootstrap in-process: the security interceptor and error mapping."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import uvloop
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.common.rpc import error_from_rpc
from sluice.errors import AuthenticationError, InvalidArgument
from sluice.security.authenticate import ServerAuthenticator
from sluice.security.service import ServiceSecurity
from sluice.server.runtime import EVENT_LOOP_ENV, GrpcServer, event_loop_runner


def _echo(server: grpc.aio.Server) -> None:
    """A method no guard lists: the interceptor must treat it as internal (cluster only)."""

    async def call(request: bytes, context: object) -> bytes:
        return request

    handler = grpc.unary_unary_rpc_method_handler(call)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Call": handler}),))


def test_an_unlisted_method_needs_the_cluster_and_health_stays_open() -> None:
    """The interceptor authenticates every call, refuses with a typed error, applies the guard table
    (a method missing from it is cluster-only, never open), and leaves the health service open."""

    async def scenario() -> None:
        security = ServiceSecurity(
            "authtest",
            ServerAuthenticator(mechanisms=frozenset({"scram"}), cluster_token=b"s3cret"),
        )
        server = GrpcServer("authtest", [_echo], metrics_port=None, security=security)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                echo = channel.unary_unary("/test.Echo/Call", None, None)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await echo(b"hi", timeout=5)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                err = error_from_rpc(refused.value)
                assert isinstance(err, AuthenticationError)
                assert "requires authentication" in err.message
                with pytest.raises(grpc.aio.AioRpcError) as wrong:
                    await echo(b"hi", timeout=5, metadata=(("authorization", "Bearer nope"),))
                assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
                ok = await echo(b"hi", timeout=5, metadata=(("authorization", "Bearer s3cret"),))
                assert ok == b"hi"
                health = health_pb2_grpc.HealthStub(channel)
                status = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert status.status == health_pb2.HealthCheckResponse.SERVING
        finally:
            await server.stop(0)
            await server.stop(0)  # idempotent

    asyncio.run(scenario())


def test_services_run_on_uvloop_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    assert event_loop_runner() is uvloop.run
    monkeypatch.setenv(EVENT_LOOP_ENV, "asyncio")
    assert event_loop_runner() is asyncio.run
    monkeypatch.setenv(EVENT_LOOP_ENV, "twisted")
    with pytest.raises(InvalidArgument, match="SLUICE_EVENT_LOOP must be uvloop or asyncio"):
        event_loop_runner()
