"""The root of the typed errors and their one registry (``sluice.errors`` defines the classes).

Every error has a wire ``code`` (``sluice.v1.ErrorCode``), a ``retriable`` flag
and a human-readable message. One registry maps a wire code to its class, so
neither side writes if-chains per call site: the server interceptor turns a
raised ``SluiceError`` into a gRPC status carrying the code, and the SDK turns
that status (or a per-partition ``Error`` message) back into the same class.
Import everything from ``sluice.errors``; this module exists so that file stays small.
"""

from __future__ import annotations

from typing import ClassVar

from sluice.error_text import bounded_message
from sluice.v1 import common_pb2

__all__ = [
    "SluiceError",
    "error_for_code",
    "error_from_proto",
    "raise_for_proto",
    "registry",
]

_REGISTRY: dict[int, type[SluiceError]] = {}


class SluiceError(Exception):
    """Root of every Sluice error. ``code`` is the wire error code."""

    code: ClassVar[int] = common_pb2.UNKNOWN
    retriable: ClassVar[bool] = False
    #: The gRPC status name used when this error ends an RPC.
    grpc_status: ClassVar[str] = "UNKNOWN"

    def __init__(self, message: str = "", **fields: object) -> None:
        super().__init__(message or self.code_name)
        self.message = message or self.code_name
        self.fields = fields

    @property
    def code_name(self) -> str:
        return common_pb2.ErrorCode.Name(self.code)  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}"

    def to_proto(self) -> common_pb2.Error:
        # Bounded: a per-partition error travels in a response body, where no trailer limit cuts it.
        return common_pb2.Error(code=self.code, message=bounded_message(self.message))  # type: ignore[arg-type]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            if cls.code in _REGISTRY:
                raise TypeError(f"error code {cls.code} registered twice")
            _REGISTRY[cls.code] = cls


_REGISTRY[common_pb2.UNKNOWN] = SluiceError


def registry() -> dict[int, type[SluiceError]]:
    """A copy of the code -> class registry (for tests and docs)."""
    return dict(_REGISTRY)


def error_for_code(code: int, message: str = "") -> SluiceError:
    """Build the typed error for a wire code; unknown codes become SluiceError.

    The registry lookup itself. The SDK never calls it: it decodes through
    ``error_from_proto`` (an ``Error`` message) or ``sluice.common.rpc.error_from_rpc``
    (a gRPC status, which hands its code to ``error_from_proto``).
    """
    cls = _REGISTRY.get(code, SluiceError)
    return cls(message)


def error_from_proto(err: common_pb2.Error | None, where: str = "") -> SluiceError | None:
    """THE decoder: the typed error an ``Error`` message carries, or None when it carries none.

    The inverse of ``SluiceError.to_proto``. Every error the SDK receives -- a per-partition or
    per-request ``Error`` in a response, a stream event, a wire frame, or a gRPC status (via
    ``error_from_rpc``) -- becomes an exception here and nowhere else. ``where`` (e.g.
    ``"topic[3]"``) prefixes the message as ``"where: message"``.
    """
    if err is None or not err.code:  # NONE
        return None
    return error_for_code(err.code, f"{where}: {err.message}" if where else err.message)


def raise_for_proto(err: common_pb2.Error | None, where: str = "") -> None:
    """Raise the typed error carried by an ``Error`` message, if any."""
    error = error_from_proto(err, where)
    if error is not None:
        raise error
