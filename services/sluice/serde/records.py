"""Where the serializers meet records: the producer's send path and the consumers' hand-out.

The SDK cores call these, so the sync SDK and ``sluice.aio`` (which passes the same config objects
through) serialize alike. A consumer's deserialized record is a :class:`DeserializedRecord`: a
``Record`` whose ``key``/``value`` are the deserializers' results, with ``raw`` the record as stored
(``reconsume_later`` and dead-letter code send ``raw``, never the objects).
"""

from __future__ import annotations

from typing import Any

from sluice.codec.batch import Record
from sluice.errors import DeserializationError, SerializationError
from sluice.serde.builtin import Deserializer, Serializer, resolve_deserializer, resolve_serializer

__all__ = ["DeserializedRecord", "RecordDeserializer", "RecordSerializer", "raw_record"]

_new = tuple.__new__


class DeserializedRecord(Record):
    """A ``Record`` whose ``key`` and ``value`` went through the consumer's deserializers (so they may
    be any type, whatever ``Record``'s annotations say). ``raw`` is the record as stored."""

    raw: Record

    def __repr__(self) -> str:
        return "Deserialized" + super().__repr__()


def raw_record(record: Record) -> Record:
    """The record as stored: ``record.raw`` for a deserialized one, else ``record`` itself."""
    # getattr: a copy made with _replace() is a DeserializedRecord without ``raw``; it is what it holds.
    raw: Record = getattr(record, "raw", record)
    return raw


class RecordSerializer:
    """A producer's key and value serializers, applied in ``send()`` before anything is queued."""

    __slots__ = ("_key", "_value")

    def __init__(self, key: Serializer | None, value: Serializer | None) -> None:
        self._key = key
        self._value = value

    @classmethod
    def of(cls, key_spec: object, value_spec: object) -> RecordSerializer | None:
        """None when neither option is set: the send path then skips serialization entirely."""
        key = resolve_serializer(key_spec, "key_serializer")
        value = resolve_serializer(value_spec, "value_serializer")
        return None if key is None and value is None else cls(key, value)

    def __call__(self, value: Any, key: Any) -> tuple[Any, Any]:
        if self._value is not None:
            value = _serialize(self._value, value, is_key=False)
        if self._key is not None and key is not None:  # no key stays no key
            key = _serialize(self._key, key, is_key=True)
        return value, key


def _serialize(fn: Serializer, obj: Any, *, is_key: bool) -> bytes:
    what = "key" if is_key else "value"
    try:
        out = fn(obj)
    except Exception as exc:
        raise SerializationError(
            f"the {what} serializer failed on a {type(obj).__name__}: {exc}", is_key=is_key
        ) from exc
    if isinstance(out, bytes):
        return out
    if isinstance(out, bytearray | memoryview):
        return bytes(out)
    raise SerializationError(
        f"the {what} serializer returned a {type(out).__name__}, not bytes", is_key=is_key
    )


class RecordDeserializer:
    """A consumer's key and value deserializers, applied to the records it hands out."""

    __slots__ = ("_key", "_value", "failed")

    def __init__(self, key: Deserializer | None, value: Deserializer | None) -> None:
        self._key = key
        self._value = value
        #: The failure of the record a group consumer just handed out alone; its poll() raises it.
        self.failed: DeserializationError | None = None

    @classmethod
    def of(cls, key_spec: object, value_spec: object) -> RecordDeserializer | None:
        key = resolve_deserializer(key_spec, "key_deserializer")
        value = resolve_deserializer(value_spec, "value_deserializer")
        return None if key is None and value is None else cls(key, value)

    def key(self, raw: bytes | None, record: Any) -> Any:
        """The deserialized key (None stays None); DeserializationError carrying ``record`` if it fails
        (``record``: the raw Record, or a function that builds it)."""
        if self._key is None or raw is None:
            return raw
        return _deserialize(self._key, raw, record, is_key=True)

    def value(self, raw: bytes, record: Any) -> Any:
        if self._value is None:
            return raw
        return _deserialize(self._value, raw, record, is_key=False)

    def one(self, r: Record) -> DeserializedRecord:
        """``r`` deserialized; raises DeserializationError carrying ``r``."""
        # Inlined (not self.key / self.value): this runs once per consumed record.
        key = r.key
        if key is not None and self._key is not None:
            try:
                key = self._key(key)
            except Exception as exc:
                raise _failure(exc, r, is_key=True) from exc
        value = r.value
        if self._value is not None:
            try:
                value = self._value(value)
            except Exception as exc:
                raise _failure(exc, r, is_key=False) from exc
        out: DeserializedRecord = _new(
            DeserializedRecord, (r.topic, r.partition, r.offset, key, value, r.tag, r.headers, r.timestamp)
        )
        out.raw = r
        return out

    def take(
        self, records: list[Record], start: int, count: int
    ) -> tuple[list[Record], DeserializationError | None]:
        """``records[start:start + count]`` deserialized, up to the first that fails: (the ones before it,
        its error) -- or (all of them, None)."""
        out: list[Record] = []
        one = self.one
        for r in records[start : start + count]:
            try:
                out.append(one(r))
            except DeserializationError as exc:
                return out, exc
        return out, None

    # ---- the group consumer's hand-out (consumer.Consumer._collect) --------------------------------

    def plan(self, records: list[Record], start: int, count: int, first: bool) -> tuple[int, list[Record]]:
        """How many of ``records[start:start + count]`` a poll takes, and them deserialized.

        Up to the first that fails. That one is handed out alone, as the error of a poll that returns
        nothing else (``first``: nothing was collected before it): the poll takes it (1, []) and
        raises ``failed``; the next poll goes on after it. Otherwise (0, []): this poll stops before it.
        So every record reaches the application exactly once, as an object or as the error carrying it.
        """
        converted, error = self.take(records, start, count)
        if error is None:
            return count, converted
        if converted:
            return len(converted), converted
        if first:
            self.failed = error
            return 1, []
        return 0, []

    def raise_failed(self) -> None:
        """Raise (once) the failure of the record the last hand-out took alone: every consumer loop
        (``poll()``, and any other that hands out through ``_collect``) calls it right after."""
        failed, self.failed = self.failed, None
        if failed is not None:
            raise failed

    def handed(self, converted: list[Record], count: int) -> list[Record]:
        """The first ``count`` of a plan's records, when something else (a retry topic's due time)
        took only ``count``; a failing record not taken is not raised."""
        if count == 0:
            self.failed = None
        return converted[:count]


def _deserialize(fn: Deserializer, raw: bytes, record: Any, *, is_key: bool) -> Any:
    """``record``: the raw record, or a function that builds it (only a failure needs it)."""
    try:
        return fn(raw)
    except Exception as exc:
        raise _failure(exc, record() if callable(record) else record, is_key=is_key) from exc


def _failure(exc: Exception, record: Any, *, is_key: bool) -> DeserializationError:
    what = "key" if is_key else "value"
    where = f"{record.topic}[{record.partition}]@{record.offset}"
    return DeserializationError(
        f"{where}: the {what} deserializer failed ({type(exc).__name__}: {exc}); "
        "the raw record is on the error's .record",
        record=record,
        is_key=is_key,
    )
