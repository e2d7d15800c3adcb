"""Serializers end to end: producers serialize, group and push consumers deserialize, and a record that
fails to deserialize reaches the application once, as DeserializationError carrying the raw record,
without stopping the consumer or losing the records around it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from sluice import Client
from sluice.client.producer.delay import SCHEDULE_TOPIC
from sluice.client.push import Message
from sluice.errors import DeserializationError, SerializationError
from sluice.serde.avro import AvroDeserializer, AvroSerializer, SchemaRegistry
from sluice.serde.protobuf import ProtobufDeserializer, ProtobufSerializer
from sluice.v1 import common_pb2

POISON = b"\xff not json"


def _produce_mixed(client: Client, topic: str, n: int, poison: set[int]) -> None:
    """Offsets 0..n-1 of partition 0: JSON ``{"i": i}`` with key ``k<i>`` from a serializing producer,
    and raw bytes no JSON reader accepts at the ``poison`` offsets."""
    with (
        client.producer(topic, value_serializer="json", key_serializer="str", linger=0) as js,
        client.producer(topic, linger=0) as raw,
    ):
        for i in range(n):
            if i in poison:
                meta = raw.send(POISON, key=b"\xfe", partition=0, headers={"h": b"%d" % i}).result(10)
            else:
                meta = js.send({"i": i}, key=f"k{i}", partition=0).result(10)
            assert meta.offset == i


def test_group_consumer_raises_each_bad_record_once_and_loses_nothing(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic()
    n, poison = 12, {0, 4, 5, 11}  # first, two in a row, last
    _produce_mixed(client, topic, n, poison)
    good: dict[int, tuple[Any, Any]] = {}
    bad: list[DeserializationError] = []
    seen: list[int] = []
    with client.consumer(
        f"g-{uuid.uuid4().hex[:8]}",
        topic,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        value_deserializer="json",
        key_deserializer="str",
    ) as consumer:
        deadline = time.monotonic() + 30
        for _ in range(200):
            if len(seen) >= n or time.monotonic() > deadline:
                break
            try:
                records = consumer.poll(timeout=0.5)
            except DeserializationError as exc:
                bad.append(exc)
                seen.append(exc.offset or 0)
                continue
            for r in records:
                good[r.offset] = (r.key, r.value)
                seen.append(r.offset)
        assert sorted(seen) == list(range(n))  # each record exactly once, as an object or as an error
        assert good == {i: (f"k{i}", {"i": i}) for i in range(n) if i not in poison}
        assert [e.offset for e in bad] == sorted(poison)
        for e in bad:
            assert (e.topic, e.partition, e.raw_key, e.raw_value) == (topic, 0, b"\xfe", POISON)
            assert e.headers == {"h": str(e.offset).encode()}
            assert e.is_key  # the key deserializer runs first, and b"\xfe" is not UTF-8 either
        # Processed means past the last bad record too: the commit covers everything.
        assert consumer.commit() == {(topic, 0): n}
        assert consumer.poll(timeout=0.2) == []


def test_in_flight_min_a_bad_record_is_done_like_any_other(
    client: Client, new_topic: Callable[..., str]
) -> None:
    """commit_mode="in-flight-min": the bad record holds the commit back until the application says it
    is handled (``done(err.record)``); then the commit covers it."""
    topic = new_topic()
    n, poison = 6, {2}
    _produce_mixed(client, topic, n, poison)
    records: list[Any] = []
    bad: list[DeserializationError] = []
    with client.consumer(
        f"g-{uuid.uuid4().hex[:8]}",
        topic,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        commit_mode="in-flight-min",
        value_deserializer="json",
    ) as consumer:
        deadline = time.monotonic() + 20
        while len(records) + len(bad) < n and time.monotonic() < deadline:
            try:
                records += consumer.poll(timeout=0.5)
            except DeserializationError as exc:
                bad.append(exc)
        assert [r.offset for r in records] == [0, 1, 3, 4, 5]
        assert [e.offset for e in bad] == [2]
        for r in records:
            consumer.done(r)
        assert consumer.commit() == {(topic, 0): 2}  # held at the bad record, not yet handled
        assert bad[0].record is not None
        consumer.done(bad[0].record)  # type: ignore[arg-type]
        assert consumer.commit() == {(topic, 0): n}


def test_a_delayed_send_is_serialized_once(client: Client, new_topic: Callable[..., str]) -> None:
    """A delayed record waits in the schedule topic as the bytes the serializer made: the schedule's own
    producer does not serialize them again."""
    topic = new_topic()
    client.admin.create_topic(SCHEDULE_TOPIC, partitions=1)  # what `sluice scheduler` creates
    with client.producer(topic, value_serializer="json", key_serializer="str") as producer:
        meta = producer.send({"a": 1}, key="k", deliver_after=timedelta(hours=1)).result(10)
    assert meta.topic != topic  # its place in the schedule topic
    with client.fetcher({(meta.topic, meta.partition): meta.offset}) as f:
        records = f.fetch(timeout=5.0)
    assert [(r.key, r.value) for r in records[:1]] == [(b"k", b'{"a":1}')]


def test_a_serializer_failure_queues_nothing_and_the_producer_goes_on(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic()
    with client.producer(topic, value_serializer="json") as producer:
        with pytest.raises(SerializationError) as info:
            producer.send({"when": object()})
        assert not info.value.is_key
        producer.send({"ok": 1}).result(10)
    with client.fetcher({(topic, 0): 0}) as f:
        records = f.fetch(timeout=5.0)
    assert [(r.offset, r.value) for r in records] == [(0, b'{"ok":1}')]


ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "customer", "type": "string"}],
}


def test_avro_values_and_protobuf_keys_through_a_push_consumer(
    client: Client, new_topic: Callable[..., str]
) -> None:
    """Framed Avro (magic byte + schema id) read back through a registry, keys as protobuf messages;
    ``raw_value`` keeps the bytes on the wire."""
    topic = new_topic(partitions=2)
    registry = SchemaRegistry()
    sid = registry.register(ORDER)
    n = 20
    with client.push_consumer(
        topic,
        "s",
        "shared",
        initial_position="earliest",
        value_deserializer=AvroDeserializer(schemas=registry),
        key_deserializer=ProtobufDeserializer(common_pb2.Error),
    ) as pc:
        with client.producer(
            topic,
            value_serializer=AvroSerializer(ORDER, schema_id=sid),
            key_serializer=ProtobufSerializer(common_pb2.Error),
        ) as producer:
            for i in range(n):
                producer.send({"id": i, "customer": f"c{i}"}, key=common_pb2.Error(code=i, message="k"))  # type: ignore[arg-type]
        got: dict[int, Any] = {}
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            msg = pc.receive(timeout=1.0)
            order: Any = msg.value
            assert msg.key == common_pb2.Error(code=order["id"], message="k")
            raw: bytes = msg.raw_value  # type: ignore[attr-defined]
            assert raw[:5] == b"\x00" + sid.to_bytes(4, "big")
            got[order["id"]] = order
            pc.ack(msg)
    assert got == {i: {"id": i, "customer": f"c{i}"} for i in range(n)}


def test_push_consumer_message_that_fails_can_be_nacked_then_acked(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic()
    n, poison = 8, {3}
    _produce_mixed(client, topic, n, poison)
    good: dict[int, Any] = {}
    failures: list[tuple[int, int]] = []  # (offset, redelivery_count)
    errors: list[DeserializationError] = []
    with client.push_consumer(
        topic, "s", initial_position="earliest", value_deserializer="json", nack_delay="100ms"
    ) as pc:
        deadline = time.monotonic() + 20
        while (len(good) < n - len(poison) or len(failures) < 2) and time.monotonic() < deadline:
            msg: Message = pc.receive(timeout=1.0)
            try:
                value = msg.value
            except DeserializationError as exc:
                errors.append(exc)
                failures.append((msg.offset, msg.redelivery_count))
                # The first time it is nacked (comes back), the second time acked (given up).
                (pc.nack if msg.redelivery_count == 0 else pc.ack)(msg)
                continue
            good[msg.offset] = value
            pc.ack(msg)
        assert good == {i: {"i": i} for i in range(n) if i not in poison}
        assert failures == [(3, 0), (3, 1)]
        assert [(e.offset, e.raw_value, e.raw_key) for e in errors] == [(3, POISON, b"\xfe")] * 2
