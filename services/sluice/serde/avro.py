"""Avro with fastavro (the ``avro`` extra): a schema given, or named in each payload by id.

Two payload layouts, chosen by whether a schema id is in play:

* **Plain:** the Avro binary encoding of one datum, nothing else. Writer and reader agree on the schema
  out of band (``AvroSerializer(schema)`` / ``AvroDeserializer(schema)``).
* **Framed (the Confluent wire format):** ``0x00`` (magic byte), the schema id as 4 bytes big-endian,
  then the Avro body. ``AvroSerializer(schema, schema_id=7)`` writes it; ``AvroDeserializer(schemas=...)``
  reads the id of each payload and asks ``schemas`` for the writer's schema. So records written under
  several schema versions read back side by side, and the layout is the one Kafka's schema-registry
  serializers use, so the same bytes are readable by their deserializers.

``schemas`` is the user's lookup: a mapping ``{id: schema}``, a callable ``id -> schema`` (e.g. a call to a
schema registry), or a :class:`SchemaRegistry` (a small in-memory one). Schemas it returns are parsed
once and cached per id. With both ``schemas`` and ``schema``, ``schema`` is the reader's schema: fastavro
resolves each writer's schema to it (Avro schema evolution).
"""

from __future__ import annotations

import io
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any

from sluice.errors import InvalidArgument, SerdeExtraMissing, UnknownSchema

__all__ = ["MAGIC", "AvroDeserializer", "AvroSerializer", "SchemaRegistry"]

#: First byte of a framed payload (the Confluent wire format's magic byte).
MAGIC = 0
_FRAME = struct.Struct(">bI")

SchemaLookup = Mapping[int, Any] | Callable[[int], Any]


def _fastavro() -> Any:
    try:
        import fastavro
    except ImportError:
        raise SerdeExtraMissing("the Avro serializers need fastavro: pip install 'sluice[avro]'") from None
    return fastavro


def _parse(schema: Any) -> Any:
    fastavro = _fastavro()
    if isinstance(schema, str):
        import json

        schema = json.loads(schema)
    try:
        return fastavro.parse_schema(schema)
    except Exception as exc:
        raise InvalidArgument(f"not a valid Avro schema: {exc}") from exc


class SchemaRegistry:
    """A small in-memory schema registry: ``register(schema)`` gives its id (the same schema, the same
    id); a deserializer takes it as ``schemas=``. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, Any] = {}
        self._ids: dict[str, int] = {}

    def register(self, schema: Any) -> int:
        import json

        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
        _parse(schema)  # refuse a bad schema here, not at the first record
        with self._lock:
            found = self._ids.get(text)
            if found is None:
                found = len(self._by_id) + 1
                self._ids[text] = found
                self._by_id[found] = schema
            return found

    def __call__(self, schema_id: int) -> Any:
        with self._lock:
            found = self._by_id.get(schema_id)
        if found is None:
            raise UnknownSchema(f"no schema with id {schema_id}")
        return found


class AvroSerializer:
    """``obj -> bytes``: one datum in Avro binary, framed with ``schema_id`` when given."""

    def __init__(self, schema: Any, *, schema_id: int | None = None) -> None:
        if schema_id is not None and not (
            isinstance(schema_id, int) and not isinstance(schema_id, bool) and 0 <= schema_id < 2**31
        ):
            raise InvalidArgument(f"schema_id must be an int in [0, 2**31), got {schema_id!r}")
        self._fastavro = _fastavro()
        self._schema = _parse(schema)
        self._prefix = b"" if schema_id is None else _FRAME.pack(MAGIC, schema_id)

    def __call__(self, obj: Any) -> bytes:
        out = io.BytesIO()
        out.write(self._prefix)
        self._fastavro.schemaless_writer(out, self._schema, obj)
        return out.getvalue()


class AvroDeserializer:
    """``bytes -> obj``: plain payloads with ``schema``, framed ones with ``schemas`` (see the module)."""

    def __init__(self, schema: Any = None, *, schemas: SchemaLookup | SchemaRegistry | None = None) -> None:
        if schema is None and schemas is None:
            raise InvalidArgument("AvroDeserializer needs a schema, a schema lookup (schemas=), or both")
        self._fastavro = _fastavro()
        self._reader = None if schema is None else _parse(schema)
        self._lookup = schemas
        self._writers: dict[int, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, data: bytes) -> Any:
        if self._lookup is None:
            return self._read(data, 0, self._reader, None)
        if len(data) < _FRAME.size:
            raise ValueError(f"a framed Avro payload has at least {_FRAME.size} bytes, got {len(data)}")
        magic, schema_id = _FRAME.unpack_from(data)
        if magic != MAGIC:
            raise ValueError(f"not a framed Avro payload: magic byte {magic:#x}, expected {MAGIC:#x}")
        return self._read(data, _FRAME.size, self._writer(schema_id), self._reader)

    def _read(self, data: bytes, start: int, writer: Any, reader: Any) -> Any:
        buf = io.BytesIO(data)
        buf.seek(start)
        obj = self._fastavro.schemaless_reader(buf, writer, reader)
        if buf.tell() != len(data):
            # Trailing bytes mean the payload was not written with this schema.
            raise ValueError(f"{len(data) - buf.tell()} bytes left over after the Avro datum")
        return obj

    def _writer(self, schema_id: int) -> Any:
        with self._lock:
            parsed = self._writers.get(schema_id)
        if parsed is not None:
            return parsed
        lookup = self._lookup
        try:
            raw = lookup(schema_id) if callable(lookup) else lookup[schema_id]  # type: ignore[index]
        except KeyError:
            raw = None
        if raw is None:
            raise UnknownSchema(f"the schema lookup has no schema with id {schema_id}")
        parsed = _parse(raw)
        with self._lock:
            self._writers[schema_id] = parsed
        return parsed
