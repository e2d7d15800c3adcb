"""The token on every gRPC call: client interceptors that add ``ClientSecurity.metadata()``.

They exist only on channels whose security has a token (``sluice.common.peers``): a plaintext or
TLS-only channel carries no interceptor and costs nothing more per call. The token source is asked at
every call, so a source that refreshes (a projected ServiceAccount token, an OIDC client) is sent fresh.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import grpc
from grpc import aio

from sluice.security.client import ClientSecurity

__all__ = ["TokenInterceptor", "aio_token_interceptors"]


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any


def _with_metadata(details: Any, security: ClientSecurity) -> _Details:
    metadata = list(details.metadata or ())
    metadata.extend(security.metadata())
    return _Details(
        details.method,
        details.timeout,
        metadata,
        details.credentials,
        details.wait_for_ready,
        details.compression,
    )


class TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds ``security.metadata()`` to every call of a blocking channel."""

    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_metadata(details, self._security), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(_with_metadata(details, self._security), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Iterator[Any]) -> Any:
        return continuation(_with_metadata(details, self._security), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Iterator[Any]) -> Any:
        return continuation(_with_metadata(details, self._security), requests)


def _aio_details(details: Any, security: ClientSecurity) -> aio.ClientCallDetails:
    metadata = aio.Metadata(*(details.metadata or ()))
    for key, value in security.metadata():
        metadata.add(key, value)
    return aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class _AioUnaryUnary(aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_aio_details(details, self._security), request)


class _AioUnaryStream(aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_aio_details(details, self._security), request)


class _AioStreamUnary(aio.StreamUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_aio_details(details, self._security), requests)


class _AioStreamStream(aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_aio_details(details, self._security), requests)


def aio_token_interceptors(security: ClientSecurity) -> list[aio.ClientInterceptor]:
    """The four ``grpc.aio`` interceptors (aio needs one object per call kind)."""
    interceptors: list[Any] = [
        _AioUnaryUnary(security),
        _AioUnaryStream(security),
        _AioStreamUnary(security),
        _AioStreamStream(security),
    ]
    return interceptors
