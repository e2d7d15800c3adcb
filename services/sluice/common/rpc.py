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

from sluice.errors import BrokerNotAvailable, RequestTimedOut, SluiceError, error_for_code

ERROR_CODE_KEY = "sluice-error-code"
# Messages carry whole record batches; servers use the same limit.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),
)

Resp = TypeVar("Resp")


def error_from_rpc(exc: grpc.RpcError) -> SluiceError:
    """Rebuild the typed error a server raised, or classify a transport failure."""
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
    if code_text is not None:
        return error_for_code(int(code_text), details)
    status = call.code() if hasattr(call, "code") else None
    if status == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimedOut(details or "deadline exceeded")
    if status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return BrokerNotAvailable(details or "service unavailable")
    return SluiceError(f"{status.name if status else 'UNKNOWN'}: {details}")


def call(method: Callable[..., Resp], request: Any, timeout: float | None = None) -> Resp:
    """Invoke a unary stub method; raise the typed error on failure."""
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as exc:
        raise error_from_rpc(exc) from None
