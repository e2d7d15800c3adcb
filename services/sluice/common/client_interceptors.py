"""The token on every gRPC call: client interceptors that add ``ClientSecurity.metadata()``.

They exist only on channels whose security has a token (``sluice.common.peers``): a plaintext or
TLS-only channel carries no interceptor and costs nothing more per call. The token source is asked at
every call, so a source that refreshes (a projected ServiceAccount token, an OIDC client) is sent fresh.
When a call ends UNAUTHENTICATED (CREDENTIALS_EXPIRED included), the source is told which token was
refused (``sluice.common.client_security.refused``): a SCRAM login fetches a new session for the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import grpc
from grpc import aio

from sluice.common.client_security import AUTHORIZATION_KEY, ClientSecurity, refreshable, refused

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


def _unauthenticated(outcome: Any) -> bool:
    try:
        return bool(outcome.code() == grpc.StatusCode.UNAUTHENTICATED)
    except Exception:
        return False


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
        sent = _with_metadata(details, self._security)
        outcome = continuation(sent, request)
        token = _sent_token(sent.metadata)
        # A blocking call comes back done: one refused for its token (a session the server no longer
        # takes) is sent once more with a new one. Safe: a call refused at authentication never ran.
        # A future (not done yet) is only watched.
        if (
            token is not None
            and outcome.done()
            and _unauthenticated(outcome)
            and refused(self._security, token)
        ):
            sent = _with_metadata(details, self._security)
            outcome = continuation(sent, request)
            token = _sent_token(sent.metadata)
        return _watch(outcome, self._security, token)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._call(continuation, details, request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Iterator[Any]) -> Any:
        return self._call(continuation, details, requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Iterator[Any]) -> Any:
        return self._call(continuation, details, requests)


def _aio_watch(call: Any, security: ClientSecurity, token: str | None) -> Any:
    """:func:`_watch` for ``grpc.aio``, whose ``code()`` is a coroutine: it is read in a task once the
    call is done (it then answers at once)."""
    if token is None or not refreshable(security):
        return call

    async def check(finished: Any) -> None:
        with contextlib.suppress(Exception):
            if await finished.code() == grpc.StatusCode.UNAUTHENTICATED:
                refused(security, token)

    def done(finished: Any) -> None:
        with contextlib.suppress(RuntimeError):  # no running loop: the channel is closing
            task = asyncio.get_running_loop().create_task(check(finished))
            _pending.add(task)
            task.add_done_callback(_pending.discard)

    with contextlib.suppress(Exception):
        call.add_done_callback(done)
    return call


#: The tasks of :func:`_aio_watch` until they end (a task nobody holds may be collected half-way).
_pending: set[asyncio.Task[None]] = set()


async def _aio_details(details: Any, security: ClientSecurity) -> aio.ClientCallDetails:
    """The call's details with the token. A source with ``fresh`` (a SCRAM login) is awaited, so a
    login it has to do runs in a worker thread, not on the event loop."""
    metadata = aio.Metadata(*(details.metadata or ()))
    fresh = getattr(security.token, "fresh", None)
    if fresh is not None:
        metadata.add(AUTHORIZATION_KEY, f"Bearer {await fresh()}")
    else:
        for key, value in security.metadata():
            metadata.add(key, value)
    return aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class _AioUnaryUnary(aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        sent = await _aio_details(details, self._security)
        call = await continuation(sent, request)
        token = _sent_token(sent.metadata)
        # As the blocking interceptor: one more try with a new token after a refusal of this one.
        if (
            token is not None
            and refreshable(self._security)
            and await call.code() == grpc.StatusCode.UNAUTHENTICATED
            and refused(self._security, token)
        ):
            sent = await _aio_details(details, self._security)
            call = await continuation(sent, request)
        return call


class _AioUnaryStream(aio.UnaryStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        sent = await _aio_details(details, self._security)
        return _aio_watch(await continuation(sent, request), self._security, _sent_token(sent.metadata))


class _AioStreamUnary(aio.StreamUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        sent = await _aio_details(details, self._security)
        return _aio_watch(await continuation(sent, requests), self._security, _sent_token(sent.metadata))


class _AioStreamStream(aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, security: ClientSecurity) -> None:
        self._security = security

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        sent = await _aio_details(details, self._security)
        return _aio_watch(await continuation(sent, requests), self._security, _sent_token(sent.metadata))


def aio_token_interceptors(security: ClientSecurity) -> list[aio.ClientInterceptor]:
    """The four ``grpc.aio`` interceptors (aio needs one object per call kind)."""
    interceptors: list[Any] = [
        _AioUnaryUnary(security),
        _AioUnaryStream(security),
        _AioStreamUnary(security),
        _AioStreamStream(security),
    ]
    return interceptors
