"""The shared server bootstrap in-process: the authentication slot and error mapping."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.common.rpc import error_from_rpc
from sluice.errors import Unauthenticated
from sluice.server.runtime import GrpcServer


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
