"""The token on every gRPC call: client interceptors that add ``ClientSecurity.metadata()``.

They exist only on channels whose security has a token (``sluice.common.peers``): a plaintext or
TLS-only channel carries no interceptor and costs nothing more per call. The token source is asked at
every call, so a source that refreshes (a projected ServiceAccount token, an OIDC client) is sent fresh.
When a call ends UNAUTHENTICATED (CREDENTIALS_EXPIRED included), the source is told which token was
refused (``sluice.security.credentials.refused``): a SCRAM login fetches a new session for the next call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import grpc
from grpc import aio

from sluice.security.client import AUTHORIZATION_KEY, ClientSecurity
from sluice.security.credentials import refreshable, refused

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


def _sent_token(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == AUTHORIZATION_KEY and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer ") :]
    return None


def _watch(call: Any, security: ClientSecurity, token: str | None) -> Any:
    """Tell the token source when ``call`` ends UNAUTHENTICATED (only for a source that can renew)."""
    if token is None or not refreshable(security):
        return call

    def done(finished: Any) -> None:
        try:
            code = finished.code()
        except Exception:  # a call that never started has no code; nothing to learn
            return
        if code == grpc.StatusCode.UNAUTHENTICATED:
            refused(security, token)

    with contextlib.suppress(Exception):  # an outcome object without callbacks: nothing to watch
        call.add_done_callback(done)
    return call


class TokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds ``security.metadata()`` to every call of a blocking channel."""

    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    def _call(self, continuation: Any, details: Any, request: Any) -> Any:
        sent = _with_metadata(details, self._security)
        return _watch(continuation(sent, request), self._security, _sent_token(sent.metadata))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._call(continuation, details, request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._call(continuation, details, request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Iterator[Any]) -> Any:
        return self._call(continuation, details, requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Iterator[Any]) -> Any:
        return self._call(continuation, details, requests)


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
        sent = _aio_details(details, self._security)
        return _watch(await continuation(sent, request), self._security, _sent_token(sent.metadata))


class _AioUnaryStream(aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        sent = _aio_details(details, self._security)
        return _watch(await continuation(sent, request), self._security, _sent_token(sent.metadata))


class _AioStreamUnary(aio.StreamUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        sent = _aio_details(details, self._security)
        return _watch(await continuation(sent, requests), self._security, _sent_token(sent.metadata))


class _AioStreamStream(aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        sent = _aio_details(details, self._security)
        return _watch(await continuation(sent, requests), self._security, _sent_token(sent.metadata))


def aio_token_interceptors(security: ClientSecurity) -> list[aio.ClientInterceptor]:
    """The four ``grpc.aio`` interceptors (aio needs one object per call kind)."""
    interceptors: list[Any] = [
        _AioUnaryUnary(security),
        _AioUnaryStream(security),
        _AioStreamUnary(security),
        _AioStreamStream(security),
    ]
    return interceptors
