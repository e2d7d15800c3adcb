"""``sluice_internal_errors_total``: counted for an exception that escapes a handler (which stays INTERNAL),
never for bad input (a typed error, or bytes that are not the request). A real gRPC server in process
with the services' interceptor chain, and handlers that fail on purpose."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc import aio

from sluice.errors import InvalidArgument
from sluice.server.interceptors import ServiceInterceptor
from sluice.server.metrics import INTERNAL_ERRORS
from sluice.v1 import coordinator_pb2

SERVICE = "unit-internal"


def _count(method: str) -> float:
    return float(INTERNAL_ERRORS.labels(SERVICE, method)._value.get())


async def _boom(request: Any, context: Any) -> Any:
    raise RuntimeError("a bug")


async def _bad(request: Any, context: Any) -> Any:
    raise InvalidArgument("bad input " + "x" * 10_000)


async def _echo(
    request: coordinator_pb2.ListTopicsRequest, context: Any
) -> coordinator_pb2.ListTopicsResponse:
    return coordinator_pb2.ListTopicsResponse()


async def _stream_boom(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
    async for _ in requests:
        raise RuntimeError("a bug in a stream")
    yield coordinator_pb2.ListTopicsResponse()  # pragma: no cover


def _handlers() -> grpc.GenericRpcHandler[Any, Any]:
    parse = coordinator_pb2.ListTopicsRequest.FromString
    ser = coordinator_pb2.ListTopicsResponse.SerializeToString
    return grpc.method_handlers_generic_handler(
        "t.T",
        {
            "Boom": grpc.unary_unary_rpc_method_handler(_boom, parse, ser),
            "Bad": grpc.unary_unary_rpc_method_handler(_bad, parse, ser),
            "Echo": grpc.unary_unary_rpc_method_handler(_echo, parse, ser),
            "StreamBoom": grpc.stream_stream_rpc_method_handler(_stream_boom, parse, ser),
        },
    )


async def _scenario() -> dict[str, grpc.StatusCode]:
    server = aio.server(interceptors=[ServiceInterceptor(SERVICE)])
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    codes: dict[str, grpc.StatusCode] = {}
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            empty = coordinator_pb2.ListTopicsRequest().SerializeToString()
            for method, payload in (("Boom", empty), ("Bad", empty), ("Echo", b"\xff\xff")):
                try:
                    await ch.unary_unary(f"/t.T/{method}", None, None)(payload, timeout=10)
                    codes[method] = grpc.StatusCode.OK
                except aio.AioRpcError as exc:
                    codes[method] = exc.code()
            call = ch.stream_stream("/t.T/StreamBoom", None, None)(iter([empty]), timeout=10)
            try:
                async for _ in call:
                    pass
                codes["StreamBoom"] = grpc.StatusCode.OK
            except aio.AioRpcError as exc:
                codes["StreamBoom"] = exc.code()
    finally:
        await server.stop(None)
    return codes


def test_only_real_internal_errors_are_counted() -> None:
    before = {m: _count(m) for m in ("Boom", "Bad", "Echo", "StreamBoom")}
    codes = asyncio.run(_scenario())
    assert codes == {
        "Boom": grpc.StatusCode.INTERNAL,
        "Bad": grpc.StatusCode.INVALID_ARGUMENT,
        "Echo": grpc.StatusCode.INVALID_ARGUMENT,
        "StreamBoom": grpc.StatusCode.INTERNAL,
    }
    after = {m: _count(m) for m in before}
    assert {m: after[m] - before[m] for m in before} == {"Boom": 1, "Bad": 0, "Echo": 0, "StreamBoom": 1}
