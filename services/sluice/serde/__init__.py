"""Serializers for the SDK (docs/serializers.md).

Producers take ``key_serializer`` / ``value_serializer``, consumers and push consumers
``key_deserializer`` / ``value_deserializer``: a callable, or a built-in's name (``"bytes"``, ``"str"``,
``"json"``). Avro (``sluice.serde.avro``, the ``avro`` extra) and Protobuf (``sluice.serde.protobuf``)
serializers are objects made with their schema or message class. Tracing through record headers is in
``sluice.serde.tracing`` (the ``otel`` extra).
"""

from __future__ import annotations

from sluice.serde.builtin import (
    BUILTIN_NAMES,
    Deserializer,
    Serializer,
    json_deserializer,
    json_serializer,
    str_deserializer,
    str_serializer,
)
from sluice.serde.records import DeserializedRecord, raw_record

__all__ = [
    "BUILTIN_NAMES",
    "DeserializedRecord",
    "Deserializer",
    "Serializer",
    "json_deserializer",
    "json_serializer",
    "raw_record",
    "str_deserializer",
    "str_serializer",
]
