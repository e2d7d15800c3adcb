"""The built-in serializers round-trip what they accept, and their deserializers meet garbage with
DeserializationError carrying the raw record, never another exception."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.client.consumer import ConsumerConfig
from sluice.client.producer import ProducerConfig
from sluice.client.push import PushConsumerConfig
from sluice.codec.batch import Record
from sluice.errors import (
    DeserializationError,
    InvalidArgument,
    SerdeExtraMissing,
    SerializationError,
    UnknownSchema,
)
from sluice.serde.avro import AvroDeserializer, AvroSerializer, SchemaRegistry
from sluice.serde.builtin import json_deserializer, json_serializer, str_deserializer, str_serializer
from sluice.serde.protobuf import ProtobufDeserializer, ProtobufSerializer
from sluice.serde.records import DeserializedRecord, RecordDeserializer, RecordSerializer, raw_record
from sluice.v1 import common_pb2

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)

ORDER_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "items", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "blob", "type": "bytes"},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["NEW", "PAID"]}},
    ],
}
orders = st.fixed_dictionaries(
    {
        "id": st.integers(-(2**63), 2**63 - 1),
        "customer": st.text(),
        "amount": st.floats(allow_nan=False),
        "note": st.none() | st.text(),
        "items": st.lists(st.text(), max_size=5),
        "attrs": st.dictionaries(st.text(), st.integers(-(2**63), 2**63 - 1), max_size=5),
        "blob": st.binary(max_size=64),
        "state": st.sampled_from(["NEW", "PAID"]),
    }
)


def _record(value: bytes, key: bytes | None = None) -> Record:
    return Record("orders", 3, 17, key, value, "tagA", {"h": b"1"}, 1234)


def _same_json(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@given(st.text())
def test_str_round_trips(text: str) -> None:
    assert str_deserializer(str_serializer(text)) == text


@given(json_values)
def test_json_round_trips(value: Any) -> None:
    assert _same_json(json_deserializer(json_serializer(value)), value)


@given(orders)
def test_avro_plain_round_trips(order: dict[str, Any]) -> None:
    data = AvroSerializer(ORDER_SCHEMA)(order)
    assert AvroDeserializer(ORDER_SCHEMA)(data) == order


@given(orders)
def test_avro_framed_round_trips_through_the_schema_id(order: dict[str, Any]) -> None:
    registry = SchemaRegistry()
    sid = registry.register(ORDER_SCHEMA)
    data = AvroSerializer(ORDER_SCHEMA, schema_id=sid)(order)
    assert data[0] == 0
    assert int.from_bytes(data[1:5], "big") == sid
    assert AvroDeserializer(schemas=registry)(data) == order
    assert AvroDeserializer(schemas={sid: ORDER_SCHEMA})(data) == order


def test_avro_reader_schema_resolves_an_older_writer() -> None:
    """Two schema versions side by side: the reader's schema adds a field with a default."""
    v1 = {"type": "record", "name": "U", "fields": [{"name": "a", "type": "long"}]}
    v2 = {
        "type": "record",
        "name": "U",
        "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string", "default": "-"}],
    }
    registry = SchemaRegistry()
    id1, id2 = registry.register(v1), registry.register(v2)
    assert id1 != id2
    assert registry.register(v1) == id1
    reader = AvroDeserializer(v2, schemas=registry)
    assert reader(AvroSerializer(v1, schema_id=id1)({"a": 1})) == {"a": 1, "b": "-"}
    assert reader(AvroSerializer(v2, schema_id=id2)({"a": 2, "b": "x"})) == {"a": 2, "b": "x"}


@given(st.integers(0, 2**31 - 1), st.text(max_size=50))
def test_protobuf_round_trips(code: int, message: str) -> None:
    msg = common_pb2.Error(code=code, message=message)  # type: ignore[arg-type]
    data = ProtobufSerializer(common_pb2.Error)(msg)
    assert ProtobufDeserializer(common_pb2.Error)(data) == msg


def _deserializers() -> dict[str, RecordDeserializer]:
    registry = SchemaRegistry()
    registry.register(ORDER_SCHEMA)
    made = {
        "str": RecordDeserializer.of("str", "str"),
        "json": RecordDeserializer.of("json", "json"),
        "avro": RecordDeserializer.of(None, AvroDeserializer(ORDER_SCHEMA)),
        "avro-framed": RecordDeserializer.of(None, AvroDeserializer(schemas=registry)),
        "protobuf": RecordDeserializer.of(None, ProtobufDeserializer(common_pb2.Error)),
    }
    return {k: v for k, v in made.items() if v is not None}


DESERIALIZERS = _deserializers()


@pytest.mark.parametrize("name", sorted(DESERIALIZERS))
@given(garbage=st.binary(max_size=200), key=st.none() | st.binary(max_size=20))
def test_garbage_is_a_deserialization_error_with_the_raw_record(
    name: str, garbage: bytes, key: bytes | None
) -> None:
    raw = _record(garbage, key)
    error: DeserializationError | None = None
    try:
        out = DESERIALIZERS[name].one(raw)
    except DeserializationError as exc:
        error = exc
    if error is not None:
        assert error.record is raw
        assert (error.topic, error.partition, error.offset) == ("orders", 3, 17)
        assert (error.raw_key, error.raw_value, error.headers) == (key, garbage, {"h": b"1"})
        assert error.__cause__ is not None
    else:  # some garbage is valid input (protobuf accepts much): then it came out whole
        assert isinstance(out, DeserializedRecord)
        assert raw_record(out) is raw
        assert out[:3] == raw[:3]
        assert out.headers == raw.headers


def test_an_unknown_schema_id_is_a_deserialization_error_caused_by_unknown_schema() -> None:
    payload = AvroSerializer(ORDER_SCHEMA, schema_id=99)(
        {
            "id": 1,
            "customer": "c",
            "amount": 1.0,
            "note": None,
            "items": [],
            "attrs": {},
            "blob": b"",
            "state": "NEW",
        }
    )
    deser = RecordDeserializer.of(None, AvroDeserializer(schemas=SchemaRegistry()))
    assert deser is not None
    with pytest.raises(DeserializationError) as info:
        deser.one(_record(payload))
    assert isinstance(info.value.__cause__, UnknownSchema)


def test_take_stops_at_the_first_failure() -> None:
    deser = RecordDeserializer.of(None, "json")
    assert deser is not None
    recs = [_record(b"1"), _record(b"2"), _record(b"{"), _record(b"4")]
    ok, error = deser.take(recs, 0, 4)
    values: list[Any] = [r.value for r in ok]
    assert values == [1, 2]
    assert error is not None
    assert error.record is recs[2]
    # The group consumer's plan: the good ones now; the failing one alone, when it comes first.
    assert deser.plan(recs, 0, 4, first=True) == (2, ok)
    assert deser.plan(recs, 2, 2, first=False) == (0, [])
    assert deser.failed is None
    assert deser.plan(recs, 2, 2, first=True) == (1, [])
    assert deser.failed is not None
    assert deser.failed.record is recs[2]


def _not_bytes(value: Any) -> Any:
    return "text"


def test_serializer_failures_are_typed() -> None:
    ser = RecordSerializer.of("str", "json")
    assert ser is not None
    assert ser({"a": [1]}, "k") == (b'{"a":[1]}', b"k")
    assert ser("v", None) == (b'"v"', None)  # no key stays no key
    with pytest.raises(SerializationError) as info:
        ser(object(), None)
    assert not info.value.is_key
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(SerializationError) as info:
        ser(1, 5)  # the str serializer refuses to str() an int
    assert info.value.is_key
    with pytest.raises(SerializationError, match="not JSON compliant"):
        ser(float("nan"), None)
    with pytest.raises(SerializationError, match="not bytes"):
        RecordSerializer(None, _not_bytes)("x", None)
    with pytest.raises(SerializationError):
        RecordSerializer(None, ProtobufSerializer(common_pb2.Error))(common_pb2.ErrorCode, None)


def test_options_take_callables_and_builtin_names_only() -> None:
    assert ProducerConfig(value_serializer="json").value_serializer == "json"
    assert ProducerConfig.from_env({"SLUICE_PRODUCER_VALUE_SERIALIZER": "str"}).value_serializer == "str"
    assert ConsumerConfig.from_env({"SLUICE_CONSUMER_KEY_DESERIALIZER": "json"}).key_deserializer == "json"
    upper: Any = bytes.upper
    assert PushConsumerConfig().replace(value_deserializer=upper).value_deserializer is upper
    with pytest.raises(InvalidArgument, match="value_serializer: unknown built-in 'yaml'"):
        ProducerConfig(value_serializer="yaml")
    with pytest.raises(InvalidArgument, match="key_deserializer must be a callable"):
        ConsumerConfig(key_deserializer=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="value_deserializer"):
        PushConsumerConfig(value_deserializer="xml")


def test_avro_without_fastavro_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fastavro", None)  # what an environment without it sees
    with pytest.raises(SerdeExtraMissing, match=r"pip install 'sluice\[avro\]'"):
        AvroSerializer(ORDER_SCHEMA)
    with pytest.raises(ImportError):  # also catchable as the built-in it is
        AvroDeserializer(ORDER_SCHEMA)


def test_bad_schemas_and_classes_are_refused_up_front() -> None:
    with pytest.raises(InvalidArgument, match="Avro schema"):
        AvroSerializer({"type": "no-such-type"})
    with pytest.raises(InvalidArgument, match="schema_id"):
        AvroSerializer(ORDER_SCHEMA, schema_id=-1)
    with pytest.raises(InvalidArgument):
        AvroDeserializer()
    with pytest.raises(InvalidArgument, match="protobuf message class"):
        ProtobufDeserializer(dict)  # type: ignore[type-var]
