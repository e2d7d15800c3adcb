"""The Spark sink, the Kafka source's schema and the Kafka-source options (issue 18), in Spark local
mode against a real stack: a sink round-trip (write with the sink, read with the source, compare),
a streaming sink with a checkpoint stopped mid-stream and restarted, the schema column by column
against Spark's Kafka source, minPartitions, starting timestamps, and progress behind latest."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sluice.client.client import Client

from .conftest import Stack


def _topic(client: Client, partitions: int = 3) -> str:
    name = f"sink-{uuid.uuid4().hex[:8]}"
    client.admin.create_topic(name, partitions=partitions)
    return name


def _read(spark: Any, stack: Stack, topic: str, **options: str) -> Any:
    reader = spark.read.format("sluice").option("bootstrap", stack.bootstrap).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def _produce(client: Client, topic: str, n: int, start: int = 0, ts: int | None = None) -> None:
    with client.producer(topic) as producer:
        for i in range(start, start + n):
            producer.send(f"v{i}".encode(), key=f"k{i}".encode(), timestamp=ts)
        producer.flush()


def kafka_source_schema(include_headers: bool) -> Any:
    """Spark's Kafka source schema, transcribed field by field from Spark's
    connector/kafka-0-10-sql/.../KafkaRecordToRowConverter.scala (``kafkaSchema``):
    key binary, value binary, topic string, partition int, offset long, timestamp timestamp,
    timestampType int, and with includeHeaders, headers array<struct<key:string,value:binary>>."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


@pytest.mark.parametrize("include_headers", [False, True])
def test_the_schema_is_the_kafka_sources_column_by_column_plus_tag(
    spark: Any, stack: Stack, client: Client, include_headers: bool
) -> None:
    topic = _topic(client, partitions=1)
    schema = _read(spark, stack, topic, includeHeaders=str(include_headers).lower()).schema
    kafka = kafka_source_schema(include_headers)
    assert len(schema.fields) == len(kafka.fields) + 1
    for ours, theirs in zip(schema.fields, kafka.fields, strict=False):
        assert ours.name == theirs.name
        assert ours.dataType == theirs.dataType, ours.name
        assert ours.nullable == theirs.nullable, ours.name
    assert (schema.fields[-1].name, schema.fields[-1].dataType.simpleString()) == ("tag", "string")


def test_sink_round_trip_write_then_read_compares_equal(spark: Any, stack: Stack, client: Client) -> None:
    topic = _topic(client)
    rows = [
        (
            f"k{i % 5}".encode(),
            f"value-{i}",
            "even" if i % 2 == 0 else "odd",
            [(f"h{i % 3}", str(i).encode())],
            i % 3,
        )
        for i in range(300)
    ]
    df = spark.createDataFrame(
        rows,
        "key binary, value string, tag string, headers array<struct<key:string,value:binary>>, partition int",
    ).repartition(4)
    df.write.format("sluice").option("bootstrap", stack.bootstrap).option("topic", topic).mode(
        "append"
    ).save()
    back = _read(spark, stack, topic, includeHeaders="true").collect()
    got = sorted(
        (bytes(r.key), r.value.decode(), r.tag, [(h.key, bytes(h.value)) for h in r.headers], r.partition)
        for r in back
    )
    assert got == sorted(rows)
    assert len(back) == 300  # nothing written twice


def test_sink_routes_by_the_topic_column_and_copies_a_sluice_dataframe(
    spark: Any, stack: Stack, client: Client
) -> None:
    a, b, copy = _topic(client, 2), _topic(client, 2), _topic(client, 2)
    df = spark.createDataFrame(
        [(a if i % 3 else b, None, f"r{i}".encode()) for i in range(90)],
        "topic string, key binary, value binary",
    )
    df.write.format("sluice").option("bootstrap", stack.bootstrap).mode("append").save()
    assert _read(spark, stack, a).count() == 60
    assert _read(spark, stack, b).count() == 30
    # A DataFrame read with the source goes back as it is (offset, timestampType... are ignored);
    # the topic option wins over the topic column.
    source = _read(spark, stack, a, includeHeaders="true")
    source.write.format("sluice").option("bootstrap", stack.bootstrap).option("topic", copy).mode(
        "append"
    ).save()
    assert sorted(r.value for r in _read(spark, stack, copy).collect()) == sorted(
        r.value for r in source.collect()
    )


@pytest.mark.parametrize(
    ("schema", "options", "message"),
    [
        ("key binary", {"topic": "x"}, "needs a 'value' column"),
        ("value binary", {}, "needs the 'topic' option or a 'topic' column"),
        ("value int", {"topic": "x"}, "column 'value' is int, expected binary or string"),
        ("value binary", {"topic": "x", "acks": "0"}, "option acks"),
    ],
)
def test_a_bad_sink_schema_or_option_fails_before_writing(
    spark: Any, stack: Stack, schema: str, options: dict[str, str], message: str
) -> None:
    writer = spark.createDataFrame([], schema).write.format("sluice").option("bootstrap", stack.bootstrap)
    for k, v in options.items():
        writer = writer.option(k, v)
    with pytest.raises(Exception, match=message):
        writer.mode("append").save()


def test_streaming_sink_stopped_mid_stream_resumes_from_its_checkpoint(
    spark: Any, stack: Stack, client: Client, tmp_path: Path
) -> None:
    source, sink = _topic(client, 2), _topic(client, 2)
    _produce(client, source, 600)
    ckpt = tmp_path / "ckpt"

    def start(trigger: dict[str, Any]) -> Any:
        return (
            spark.readStream.format("sluice")
            .option("bootstrap", stack.bootstrap)
            .option("topic", source)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", "100")
            .load()
            .selectExpr("key", "value")
            .writeStream.format("sluice")
            .option("bootstrap", stack.bootstrap)
            .option("topic", sink)
            .option("checkpointLocation", str(ckpt))
            .trigger(**trigger)
            .start()
        )

    query = start({"processingTime": "1 second"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(client.list_offsets(sink, "latest").values()) < 200:
        assert query.isActive, query.exception()
        time.sleep(0.2)
    query.stop()  # mid-stream: 600 records at 100 per micro-batch
    written = sum(client.list_offsets(sink, "latest").values())
    assert 200 <= written < 600, written
    _produce(client, source, 100, start=600)
    query = start({"availableNow": True})
    query.awaitTermination(180)
    assert query.exception() is None
    values = Counter(r.value for r in _read(spark, stack, sink).collect())
    assert set(values) == {f"v{i}".encode() for i in range(700)}  # nothing lost
    # At-least-once: only a micro-batch interrupted by stop() is written again, never more.
    assert sum(values.values()) - 700 <= 100, sum(values.values())


def test_min_partitions_splits_large_partitions(spark: Any, stack: Stack, client: Client) -> None:
    topic = _topic(client, partitions=2)
    with client.producer(topic) as producer:
        for i in range(300):
            producer.send(f"v{i}".encode(), partition=0 if i < 250 else 1)
        producer.flush()
    df = _read(spark, stack, topic, minPartitions="6")
    assert df.rdd.getNumPartitions() >= 6
    assert sorted((r.partition, r.offset) for r in df.collect()) == sorted(
        [(0, o) for o in range(250)] + [(1, o) for o in range(50)]
    )
    assert _read(spark, stack, topic).rdd.getNumPartitions() == 2


def test_starting_timestamp_and_offsets_by_timestamp(spark: Any, stack: Stack, client: Client) -> None:
    topic = _topic(client, partitions=2)
    base = 1_700_000_000_000
    _produce(client, topic, 40, ts=base)
    _produce(client, topic, 40, start=40, ts=base + 60_000)
    later = _read(spark, stack, topic, startingTimestamp=str(base + 30_000)).collect()
    assert sorted(int(r.value[1:]) for r in later) == list(range(40, 80))
    by_ts = f'{{"{topic}": {{"0": {base + 30_000}}}}}'
    mixed = _read(spark, stack, topic, startingOffsetsByTimestamp=by_ts, startingOffsets="earliest").collect()
    # Partition 0 from the timestamp on, partition 1 (not named) from startingOffsets.
    assert {r.partition for r in mixed if int(r.value[1:]) < 40} == {1}
    assert {int(r.value[1:]) for r in mixed if r.partition == 0} == {
        int(r.value[1:]) for r in later if r.partition == 0
    }


def test_streaming_progress_reports_offsets_behind_latest(spark: Any, stack: Stack, client: Client) -> None:
    topic = _topic(client, partitions=2)
    _produce(client, topic, 400)
    query = (
        spark.readStream.format("sluice")
        .option("bootstrap", stack.bootstrap)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", "100")
        .load()
        .writeStream.format("memory")
        .queryName(f"behind_{uuid.uuid4().hex[:6]}")
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        deadline = time.monotonic() + 120
        progress = None
        while time.monotonic() < deadline:
            progress = query.lastProgress
            if progress and progress["sources"][0]["numInputRows"] > 0:
                break
            time.sleep(0.2)
        assert progress is not None
        src = progress["sources"][0]
        import json

        latest = (
            json.loads(src["latestOffset"]) if isinstance(src["latestOffset"], str) else src["latestOffset"]
        )
        from sluice.spark.epochs import split_offsets

        end_offset = json.loads(src["endOffset"]) if isinstance(src["endOffset"], str) else src["endOffset"]
        end, _ = split_offsets(end_offset)  # {"topic/partition": {"offset": n, "leaderEpoch": e}}
        behind = sum(latest.values()) - sum(end.values())
        assert sum(latest.values()) == 400
        assert 0 <= behind <= 300
    finally:
        query.stop()
