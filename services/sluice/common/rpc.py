"""Error mapping and channel settings for every gRPC caller: the SDK and services alike.

The inverse of ``sluice.server.interceptors``: the wire code travels in the
``sluice-error-code`` trailing metadata; transport failures (UNAVAILABLE,
DEADLINE_EXCEEDED with no code) become retriable BrokerNotAvailable /
RequestTimedOut. Services that call other services (the coordinator pushing to
brokers, the dispatcher fetching) use this module, never the SDK package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from sluice.errors import SluiceError, error_from_proto
from sluice.v1 import common_pb2

ERROR_CODE_KEY = "sluice-error-code"
# Messages carry whole record batches; servers use the same limit.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: The keepalive every channel runs (services' and the SDK's), matched to what the servers police
#: (``server/config.py``, ``ConnectionSettings``): a ping after 30 s without traffic, calls or not,
#: so a dead server (or a NAT that dropped the flow) is found in 30 + 20 s instead of at the next
#: call's deadline. Servers accept pings 10 s apart at the closest (``keepalive_min_ping_interval``),
#: so 30 s keeps clients well clear of a GOAWAY ``too_many_pings``.
KEEPALIVE_TIME_MS = 30_000
KEEPALIVE_TIMEOUT_MS = 20_000
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    # A client's pings are not limited by its own data (the server's rules are what count).
    ("grpc.http2.max_pings_without_data", 0),
)

Resp = TypeVar("Resp")


def error_from_rpc(exc: grpc.RpcError) -> SluiceError:
    """Rebuild the typed error a server raised, or classify a transport failure.

    Only unpacks the status: the code and message go through the one decoder,
    ``sluice.errors.error_from_proto``, like every ``Error`` message does.
    """
    call: Any = exc
    code_text = None
    try:
        for key, value in call.trailing_metadata() or ():
            if key == ERROR_CODE_KEY:
                code_text = value
    except Exception:
        code_text = None
    details = ""
    try:
        details = call.details() or ""
    except Exception:
        details = str(exc)
    status = call.code() if hasattr(call, "code") else None
    if code_text is not None:
        code, message = int(code_text), details
    elif status == grpc.StatusCode.DEADLINE_EXCEEDED:
        code, message = common_pb2.REQUEST_TIMED_OUT, details or "deadline exceeded"
    elif status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        code, message = common_pb2.BROKER_NOT_AVAILABLE, details or "service unavailable"
    else:
        code, message = common_pb2.UNKNOWN, f"{status.name if status else 'UNKNOWN'}: {details}"
    # A code-less SluiceError when a (broken) server sends NONE in the trailer.
    return error_from_proto(common_pb2.Error(code=code, message=message)) or SluiceError(message)  # type: ignore[arg-type]


def answered_error(exc: grpc.RpcError) -> SluiceError | None:
    """The typed error the server answered with (its ``sluice-error-code`` trailer), or None when the
    call failed in transport (unreachable, timed out): for a caller that handles those two apart."""
    call: Any = exc
    try:
        answered = any(key == ERROR_CODE_KEY for key, _ in call.trailing_metadata() or ())
    except Exception:
        return None
    return error_from_rpc(exc) if answered else None


def is_unimplemented(exc: grpc.RpcError) -> bool:
    """Whether a call failed because the server does not know the method (an older release).

    A capability probe, not an error to raise: the caller falls back to another RPC.
    """
    call: Any = exc
    try:
        return bool(call.code() == grpc.StatusCode.UNIMPLEMENTED)
    except Exception:
        return False


def call(method: Callable[..., Resp], request: Any, timeout: float | None = None) -> Resp:
    """Invoke a unary stub method; raise the typed error on failure."""
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None
