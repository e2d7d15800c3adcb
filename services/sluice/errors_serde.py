"""Typed errors of the SDK's serializers (docs/serializers.md), codes 81-84.

They live here, not in ``sluice.errors`` (which is near its size limit), and are re-exported from
there: import them from ``sluice.errors`` like every other error. None of them travels on the wire;
they have codes so that they are typed and registered like the rest.
"""

from __future__ import annotations

from typing import Protocol

from sluice.error_base import SluiceError
from sluice.v1 import common_pb2

__all__ = ["DeserializationError", "RawRecord", "SerdeExtraMissing", "SerializationError", "UnknownSchema"]


class RawRecord(Protocol):
    """What a failed record carries: ``sluice.Record`` fits it (named here, not imported: the codec
    imports ``sluice.errors``, and a cycle is not allowed even for type checking)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes: ...
    @property
    def headers(self) -> dict[str, bytes]: ...


class SerializationError(SluiceError, ValueError):
    """A producer's ``key_serializer`` or ``value_serializer`` failed; ``send()`` queued nothing.
    ``is_key`` tells which one; the serializer's own exception is the ``__cause__``."""

    code = common_pb2.SERIALIZATION_FAILED
    grpc_status = "INVALID_ARGUMENT"

    def __init__(self, message: str = "", *, is_key: bool = False) -> None:
        super().__init__(message)
        self.is_key = is_key


class DeserializationError(SluiceError):
    """A consumer's ``key_deserializer`` or ``value_deserializer`` failed on one record.

    ``record`` is the record as stored (raw bytes), so nothing is lost: log it, send it to a dead-letter
    topic, or ``reconsume_later`` it. ``is_key`` tells which deserializer failed; its exception is the
    ``__cause__``. The consumer is not harmed: its next ``poll()`` goes on after this record. A push
    consumer's message raises it from ``.key`` / ``.value``; ack or nack the message as usual.
    """

    code = common_pb2.DESERIALIZATION_FAILED
    grpc_status = "INVALID_ARGUMENT"

    def __init__(self, message: str = "", *, record: RawRecord | None = None, is_key: bool = False) -> None:
        super().__init__(message)
        self.record = record
        self.is_key = is_key

    @property
    def topic(self) -> str | None:
        return None if self.record is None else self.record.topic

    @property
    def partition(self) -> int | None:
        return None if self.record is None else self.record.partition

    @property
    def offset(self) -> int | None:
        return None if self.record is None else self.record.offset

    @property
    def raw_key(self) -> bytes | None:
        return None if self.record is None else self.record.key

    @property
    def raw_value(self) -> bytes | None:
        return None if self.record is None else self.record.value

    @property
    def headers(self) -> dict[str, bytes]:
        return {} if self.record is None else self.record.headers


class SerdeExtraMissing(SluiceError, ImportError):
    """A built-in serializer needs a library that is not installed; the message names the extra to
    install (``pip install 'sluice[avro]'``)."""

    code = common_pb2.SERDE_EXTRA_MISSING
    grpc_status = "FAILED_PRECONDITION"


class UnknownSchema(SluiceError, LookupError):
    """An Avro payload names a schema id that the deserializer's schema lookup does not know."""

    code = common_pb2.UNKNOWN_SCHEMA
    grpc_status = "NOT_FOUND"
