"""One registry maps wire codes to typed errors, and both sides agree on it."""

from __future__ import annotations

import grpc
import pytest

from sluice import errors
from sluice.client.rpc import error_from_rpc
from sluice.v1 import common_pb2


def test_every_wire_code_has_exactly_one_class() -> None:
    reg = errors.registry()
    wire_codes = {v.number for v in common_pb2.ErrorCode.DESCRIPTOR.values if v.number != common_pb2.NONE}
    assert set(reg) == wire_codes
    for code, cls in reg.items():
        assert cls.code == code


def test_timeouts_are_also_builtin_timeout_errors() -> None:
    assert issubclass(errors.RequestTimedOut, TimeoutError)
    assert errors.RequestTimedOut.retriable


def test_per_item_error_raises_its_class() -> None:
    with pytest.raises(errors.OffsetOutOfRange, match="valid range"):
        errors.raise_for_proto(
            common_pb2.Error(code=common_pb2.OFFSET_OUT_OF_RANGE, message="valid range 0..3")
        )
    errors.raise_for_proto(common_pb2.Error())  # NONE raises nothing


class _FakeCall(grpc.RpcError):
    """A stand-in for a failed grpc call object: the shape error_from_rpc reads."""

    def __init__(self, status: grpc.StatusCode, details: str, trailer: str | None) -> None:
        self._status, self._details, self._trailer = status, details, trailer

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return self._details

    # grpc-stubs types RpcError's trailers as `_Metadatum` objects; a failed call really returns
    # (key, value) pairs, and that is the shape error_from_rpc reads.
    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:  # type: ignore[override]
        return (("sluice-error-code", self._trailer),) if self._trailer else ()


def test_trailer_code_rebuilds_the_typed_error() -> None:
    err = error_from_rpc(
        _FakeCall(grpc.StatusCode.INVALID_ARGUMENT, "bad name", str(common_pb2.INVALID_TOPIC))
    )
    assert isinstance(err, errors.InvalidTopic)
    assert err.message == "bad name"


def test_transport_failures_are_retriable() -> None:
    assert error_from_rpc(_FakeCall(grpc.StatusCode.UNAVAILABLE, "down", None)).retriable
    assert isinstance(error_from_rpc(_FakeCall(grpc.StatusCode.DEADLINE_EXCEEDED, "", None)), TimeoutError)
