"""The shared server bootstrap in-process: the authentication slot and error mapping."""

from __future__ import annotations

import asyncio

import grpc
import pytest
import uvloop
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.common.rpc import error_from_rpc
from sluice.errors import InvalidArgument, Unauthenticated
from sluice.server.runtime import EVENT_LOOP_ENV, GrpcServer, event_loop_runner


class TokenAuth:
    def authenticate(self, method: str, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        if ("authorization", "Bearer s3cret") not in metadata:
            raise Unauthenticated(f"{method} needs a bearer token")


def test_authenticator_refuses_with_a_typed_error_and_admits_with_a_token() -> None:
    async def scenario() -> None:
        server = GrpcServer("authtest", [], metrics_port=None, authenticator=TokenAuth())
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                err = error_from_rpc(refused.value)
                assert isinstance(err, Unauthenticated)
                assert "bearer token" in err.message
                ok = await stub.Check(
                    health_pb2.HealthCheckRequest(), timeout=5, metadata=(("authorization", "Bearer s3cret"),)
                )
                assert ok.status == health_pb2.HealthCheckResponse.SERVING
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
