"""Persisted coordinator records: the only way durable coordinator state changes.

Every handler of the state machine returns ``(response, records)``; the service layer writes the records to
Redis atomically and then ``replay``s them, and startup recovery replays the same records loaded from Redis.
So one code path (replay) builds the state, whether live or on recovery.

A record is a *value* (a frozen dataclass subclassing :class:`RecordValue`) or a :class:`Tombstone`. Each
value type has a short stable ``TYPE`` name and a ``VERSION``. Records live in one Redis hash, like a
compacted log: the field is ``<TYPE>:<id>`` (the latest record per key wins; a tombstone deletes the field)
and the value is compact JSON ``{"v": VERSION, ...fields}``. A reader refuses a type it does not know or a
version newer than it understands, loudly, rather than silently dropping state written by a newer release.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Self, TypeAlias, TypeVar

from sluice.errors import StorageError

__all__ = ["Record", "RecordCodec", "RecordValue", "Result", "Tombstone", "record_field"]


class RecordValue(ABC):
    """A persisted record value. Subclasses are frozen dataclasses with a stable ``TYPE`` and ``VERSION``."""

    #: Short, stable type name; the first part of the Redis hash field. Never rename.
    TYPE: ClassVar[str]
    #: The newest encoding version this code writes (and the newest it can read).
    VERSION: ClassVar[int]

    @property
    @abstractmethod
    def record_id(self) -> str:
        """The key within the type: the latest record with the same (TYPE, record_id) replaces older ones."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible fields of the current VERSION (without the version itself)."""

    @classmethod
    @abstractmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        """Decode fields written under ``version`` (<= VERSION); upgrade older versions here."""

    @property
    def encoding_version(self) -> int:
        """The version this record is written as: ``VERSION``, unless the record needs nothing newer than
        an older version holds (then older coordinators can still read it; see ``TopicRecord``)."""
        return self.VERSION


@dataclass(frozen=True)
class Tombstone:
    """Deletes the record ``(type, id)``: the Redis field is removed (HDEL)."""

    type: str
    id: str


Record: TypeAlias = RecordValue | Tombstone

T = TypeVar("T")


@dataclass(frozen=True)
class Result(Generic[T]):
    """What a state-machine handler returns: the response and the records that must be persisted (and
    then replayed) before the response may be sent. Kafka's ``CoordinatorResult``."""

    response: T
    records: tuple[Record, ...] = ()


def record_field(record: Record) -> str:
    """The Redis hash field of a record: ``<TYPE>:<id>``."""
    if isinstance(record, Tombstone):
        return f"{record.type}:{record.id}"
    return f"{record.TYPE}:{record.record_id}"


class RecordCodec:
    """Encodes records to (field, bytes | None) and decodes stored fields back, by registered type."""

    def __init__(self, types: Iterable[type[RecordValue]]) -> None:
        self._types: dict[str, type[RecordValue]] = {}
        for tp in types:
            if tp.TYPE in self._types or ":" in tp.TYPE:
                raise ValueError(f"record type name {tp.TYPE!r} duplicated or invalid")
            self._types[tp.TYPE] = tp
        #: Replay order on recovery: the order the types were registered in.
        self.order = {name: i for i, name in enumerate(self._types)}

    @property
    def types(self) -> tuple[type[RecordValue], ...]:
        return tuple(self._types.values())

    def encode(self, record: Record) -> tuple[str, bytes | None]:
        field = record_field(record)
        if isinstance(record, Tombstone):
            if record.type not in self._types:
                raise ValueError(f"tombstone for unregistered record type {record.type!r}")
            return field, None
        if self._types.get(record.TYPE) is not type(record):
            raise ValueError(f"record type {type(record).__name__} is not registered with this codec")
        body = {"v": record.encoding_version, **record.to_dict()}
        return field, json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    def decode(self, field: str, value: bytes) -> RecordValue:
        type_name, _, record_id = field.partition(":")
        tp = self._types.get(type_name)
        if tp is None:
            raise StorageError(
                f"metadata record {field!r} has unknown type {type_name!r}: written by a newer coordinator? "
                "Upgrade this coordinator before starting it on this Redis."
            )
        try:
            data = json.loads(value)
            version = int(data.pop("v"))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise StorageError(f"metadata record {field!r} is corrupt: {exc}") from exc
        if version > tp.VERSION or version < 1:
            raise StorageError(
                f"metadata record {field!r} has version {version}; this coordinator reads up to "
                f"{tp.VERSION}. Upgrade this coordinator."
            )
        try:
            record = tp.from_dict(version, data)
        except (ValueError, TypeError, KeyError) as exc:
            raise StorageError(f"metadata record {field!r} is corrupt: {exc!r}") from exc
        if record.record_id != record_id:
            raise StorageError(f"metadata record {field!r} holds id {record.record_id!r}")
        return record
