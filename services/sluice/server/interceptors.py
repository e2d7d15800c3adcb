"""The server interceptor chain: security, metrics, error mapping.

Order (outermost first): security (authenticate the call, apply its guard from
``sluice.security.guards``, track a stream: ``sluice.server.call_security``), metrics,
errors. A handler raises ``SluiceError``; the error interceptor turns it into a gRPC status whose
trailing metadata carries the wire code (``sluice-error-code``), and the SDK's
inverse (``sluice.client.rpc``) rebuilds the typed error. Anything else that
escapes a handler becomes INTERNAL with the exception logged, never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
from grpc import aio

from sluice.common.rpc import ERROR_CODE_KEY
from sluice.errors import (
    LimitExceeded,
    SluiceError,
    Unauthenticated,
    bounded_message,
)
from sluice.security.live_streams import LiveStream
from sluice.security.service import ServiceSecurity
from sluice.server.call_security import MethodSecurity, StreamEnd
from sluice.server.decoding import RequestDecoder
from sluice.server.limits import connection_settings
from sluice.server.metrics import MethodRecorder, count_internal_error

log = logging.getLogger(__name__)


def _status_for(err: SluiceError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, err.grpc_status, grpc.StatusCode.UNKNOWN)


#: Trailing metadata of a refusal that says how long to wait (THROTTLING_QUOTA_EXCEEDED): milliseconds.
THROTTLE_TIME_KEY = "sluice-throttle-time-ms"


async def _abort(context: aio.ServicerContext[Any, Any], err: SluiceError) -> None:
    trailer = [(ERROR_CODE_KEY, str(err.code))]
    throttle_ms = err.fields.get("throttle_ms")
    if isinstance(throttle_ms, int):
        trailer.append((THROTTLE_TIME_KEY, str(throttle_ms)))
    context.set_trailing_metadata(tuple(trailer))
    await context.abort(_status_for(err), bounded_message(err.message))  # the status must arrive


def _method_name(full: str) -> str:
    return full.rsplit("/", 1)[-1]


def _peer_host(peer: str) -> str:
    """The client address of a gRPC peer string (``ipv4:10.0.0.7:51234``, ``ipv6:[::1]:5000``)."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0]
    return peer  # unix sockets and the like: the whole string is the address


class AddressCalls:
    """RPCs running per client address, capped (``grpc_max_rpcs_per_address``).

    grpcio tells Python nothing about connections, so Kafka's ``max.connections.per.ip`` cannot be
    enforced on a gRPC port as it is on the wire ports. What an address can make the server hold is its
    calls and streams, so those are counted instead, over all its connections: with the cap equal to
    one connection's stream cap, more connections gain an address nothing (docs/limits.md)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._running: dict[str, int] = {}

    @contextlib.contextmanager
    def admitted(self, context: aio.ServicerContext[Any, Any]) -> Iterator[None]:
        host = _peer_host(context.peer())
        running = self._running.get(host, 0)
        if running >= self.limit:
            raise LimitExceeded(
                f"{running} RPCs already run from {host[:64]}, the limit grpc_max_rpcs_per_address="
                f"{self.limit}",
                limit="grpc_max_rpcs_per_address",
                value=self.limit,
            )
        self._running[host] = running + 1
        try:
            yield
        finally:
            left = self._running[host] - 1
            if left:
                self._running[host] = left
            else:
                del self._running[host]  # bounded by the addresses with a call running


class ServiceInterceptor(aio.ServerInterceptor):  # type: ignore[type-arg]
    """Wraps every handler of one service with auth, metrics and error mapping.

    gRPC asks the interceptor for a handler on every call; the wrapped handler of
    a method is built once and cached, with its metric children resolved, so a
    call pays for two clock reads and two counter increments, nothing more.
    """

    def __init__(self, service: str, security: ServiceSecurity | None = None) -> None:
        self._service = service
        #: None when nothing is checked (no authentication, no authorization): a call then costs
        #: what it did before security existed.
        self._security = security if security is not None and security.active else None
        self._wrapped: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        self._calls = AddressCalls(connection_settings().grpc_max_rpcs_per_address)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        full = handler_call_details.method
        wrapped = self._wrapped.get(full)
        if wrapped is None:
            handler = await continuation(handler_call_details)
            if handler is None:
                return handler
            wrapped = self._wrapped[full] = self._wrap(full, handler)
        return wrapped

    def _wrap(self, full: str, handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
        method = _method_name(full)
        service = self._service
        record = MethodRecorder(service, method).record
        guard = MethodSecurity(self._security, full) if self._security is not None else None
        # Registered below with a pass-through deserializer: undecodable bytes become a typed error in
        # the handler (decoding.py), not grpcio's UNKNOWN.
        decoder = RequestDecoder(method, handler.request_deserializer)
        admitted = self._calls.admitted

        if handler.unary_unary is not None:
            # grpc-stubs types handlers with the sync context; under grpc.aio they are coroutines.
            inner_uu: Any = handler.unary_unary

            async def unary_unary(raw: Any, context: aio.ServicerContext[Any, Any]) -> Any:
                started = time.perf_counter()
                try:
                    with admitted(context):
                        who = await guard.authenticate(context) if guard is not None else None
                        request = decoder.decode(raw)
                        if guard is not None and who is not None:
                            guard.begin_call(who, context, request)
                        response = await inner_uu(request, context)
                except SluiceError as err:
                    record(err.code_name, started)
                    await _abort(context, err)
                    raise  # unreachable: abort raises
                except (aio.AbortError, aio.UsageError):
                    record("ABORTED", started)
                    raise
                except Exception:
                    log.exception("unhandled error in %s", full)
                    record("INTERNAL", started)
                    count_internal_error(service, method)
                    await context.abort(
                        grpc.StatusCode.INTERNAL, f"internal error in {method}; see server log"
                    )
                    raise
                record("OK", started)
                return response

            return grpc.unary_unary_rpc_method_handler(
                unary_unary,
                request_deserializer=None,
                response_serializer=handler.response_serializer,
            )

        if handler.stream_stream is not None:
            stream_stream = _stream_stream(
                (service, full), method, handler.stream_stream, guard, record, decoder, admitted
            )
            return grpc.stream_stream_rpc_method_handler(
                stream_stream,
                request_deserializer=None,
                response_serializer=handler.response_serializer,
            )
        # Unary-stream and stream-unary RPCs are not used by Sluice's services.
        return handler


@contextlib.asynccontextmanager
async def _stream_outcome(
    where: tuple[str, str],
    method: str,
    guard: MethodSecurity | None,
    record: Callable[[str, float], None],
    context: aio.ServicerContext[Any, Any],
    admitted: Callable[[aio.ServicerContext[Any, Any]], contextlib.AbstractContextManager[None]],
) -> AsyncIterator[LiveStream | None]:
    """Authenticate and track the stream, then record how it ended (and abort with a typed
    error, also when it was ended from outside: expiry, a right revoked)."""
    service, full = where
    started = time.perf_counter()
    end = StreamEnd()
    stream: LiveStream | None = None
    try:
        with admitted(context):
            if guard is not None:
                who = await guard.authenticate(context)
                if who is not None:
                    stream = guard.begin_stream(who, context, end)
            yield stream
    except SluiceError as err:
        record(err.code_name, started)
        await _abort(context, err)
    except asyncio.CancelledError:
        if end.error is None:
            raise
        record(end.error.code_name, started)
        await _abort(context, end.error)
    except (aio.AbortError, aio.UsageError):
        record("ABORTED", started)
        raise
    except Exception:
        log.exception("unhandled error in %s", full)
        record("INTERNAL", started)
        count_internal_error(service, method)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}; see server log")
    else:
        record("OK", started)
    finally:
        if stream is not None and guard is not None:
            guard.end_stream(stream)


def _stream_stream(
    where: tuple[str, str],
    method: str,
    inner_ss: Any,
    guard: MethodSecurity | None,
    record: Callable[[str, float], None],
    decoder: RequestDecoder,
    admitted: Callable[[aio.ServicerContext[Any, Any]], contextlib.AbstractContextManager[None]],
) -> Any:
    """The wrapped stream-stream handler: an async generator for a generator handler, a coroutine
    for one on gRPC's reader/writer API."""

    def outcome(context: aio.ServicerContext[Any, Any]) -> Any:
        return _stream_outcome(where, method, guard, record, context, admitted)

    def requests_of(request_iterator: AsyncIterator[Any]) -> AsyncIterator[Any]:
        decoded = decoder.stream(request_iterator)
        return decoded if guard is None else guard.checked_requests(decoded)

    stream_stream: Any
    if inspect.iscoroutinefunction(inner_ss):
        # gRPC's reader/writer API (the handler reads and writes through the context): the
        # dispatcher's Consume, which must not have its last message held (servicer.py).
        async def stream_stream(
            request_iterator: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]
        ) -> None:
            async with outcome(context):
                await inner_ss(requests_of(request_iterator), context)

    else:

        async def stream_stream(
            request_iterator: AsyncIterator[Any], context: aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            async with outcome(context):
                async for response in inner_ss(requests_of(request_iterator), context):
                    yield response

    return stream_stream


__all__ = ["ERROR_CODE_KEY", "ServiceInterceptor", "Unauthenticated"]
