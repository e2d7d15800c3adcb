"""The serializers' own cost per record, in one process (no services): what ``send()`` and a consumer's
hand-out add for str, JSON, Avro (plain and framed) and Protobuf, on a realistic JSON-shaped order of
about 250 bytes (Protobuf: a small two-field message). Deserializing goes through ``take``, the loop a
group consumer's hand-out runs. Results: ``bench/results/serde_cost.json``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from _stack import save
from sluice.codec.batch import Record
from sluice.serde.avro import AvroDeserializer, AvroSerializer, SchemaRegistry
from sluice.serde.protobuf import ProtobufDeserializer, ProtobufSerializer
from sluice.serde.records import RecordDeserializer, RecordSerializer
from sluice.v1 import common_pb2

ORDER_SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "items", "type": {"type": "array", "items": "string"}},
        {"name": "total", "type": "double"},
        {"name": "currency", "type": "string"},
        {"name": "note", "type": ["null", "string"]},
    ],
}


def order(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "customer": f"customer-{i % 977:05d}",
        "items": [f"sku-{(i * 7 + k) % 10_000:05d}" for k in range(5)],
        "total": round(i * 1.37 % 1000, 2),
        "currency": "EUR",
        "note": None if i % 3 else "leave at the door, ring twice, the dog is friendly",
    }


def per_record_ns(fn: Callable[[], None], n: int) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter_ns()
        fn()
        best = min(best, (time.perf_counter_ns() - start) / n)
    return round(best, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=20_000)
    n = parser.parse_args().records
    objs = [order(i) for i in range(n)]
    registry = SchemaRegistry()
    sid = registry.register(ORDER_SCHEMA)
    pb = [common_pb2.Error(code=i % 90, message=f"customer-{i}") for i in range(n)]  # type: ignore[arg-type]
    cases: dict[str, tuple[Any, Any, list[Any]]] = {
        "json": ("json", "json", objs),
        "avro": (AvroSerializer(ORDER_SCHEMA), AvroDeserializer(ORDER_SCHEMA), objs),
        "avro_framed": (
            AvroSerializer(ORDER_SCHEMA, schema_id=sid),
            AvroDeserializer(schemas=registry),
            objs,
        ),
        "protobuf": (ProtobufSerializer(common_pb2.Error), ProtobufDeserializer(common_pb2.Error), pb),
        "str": ("str", "str", [f"customer-{i}:{o['items']}" for i, o in enumerate(objs)]),
    }
    out: dict[str, object] = {"records": n}
    for name, (ser_spec, deser_spec, values) in cases.items():
        ser = RecordSerializer.of(None, ser_spec)
        deser = RecordDeserializer.of(None, deser_spec)
        assert ser is not None
        assert deser is not None
        raws = [ser(v, None)[0] for v in values]
        recs = [Record("t", 0, i, None, raw, None, {}, 0) for i, raw in enumerate(raws)]

        def serialize(ser: RecordSerializer = ser, values: list[Any] = values) -> None:
            for v in values:
                ser(v, None)

        def deserialize(deser: RecordDeserializer = deser, recs: list[Record] = recs) -> None:
            deser.take(recs, 0, len(recs))

        out[name] = {
            "bytes_per_record": round(sum(map(len, raws)) / n, 1),
            "serialize_ns_per_record": per_record_ns(serialize, n),
            "deserialize_ns_per_record": per_record_ns(deserialize, n),
        }
    save("serde_cost", out)


if __name__ == "__main__":
    main()
