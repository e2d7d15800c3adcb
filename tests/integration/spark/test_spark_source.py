"""spark.read / spark.readStream .format("sluice") against a real stack, in Spark local mode."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from sluice.client.client import Client

from .conftest import Stack


def _topic(client: Client, partitions: int = 4) -> str:
    name = f"spark-{uuid.uuid4().hex[:8]}"
    client.admin.create_topic(name, partitions=partitions)
    return name


def _produce(
    client: Client, topic: str, n: int, start: int = 0, ts: int | None = None
) -> list[tuple[bytes, str]]:
    sent = []
    with client.producer(topic) as producer:
        for i in range(start, start + n):
            tag = "even" if i % 2 == 0 else "odd"
            value = f"v{i}".encode()
            producer.send(
                value, key=f"k{i % 7}".encode(), tag=tag, headers={"i": str(i).encode()}, timestamp=ts
            )
            sent.append((value, tag))
        producer.flush()
    return sent


def _read(spark: Any, stack: Stack, topic: str, **options: str) -> Any:
    reader = spark.read.format("sluice").option("bootstrap", stack.bootstrap).option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_read_returns_exactly_the_produced_records(spark: Any, stack: Stack, client: Client) -> None:
    topic = _topic(client)
    sent = _produce(client, topic, 400)
    df = _read(spark, stack, topic, includeHeaders="true")
    rows = df.collect()
    assert len(rows) == 400
    assert sorted((r.value, r.tag) for r in rows) == sorted(sent)
    assert {r.partition for r in rows} == {0, 1, 2, 3}
    assert all([(h.key, h.value) for h in r.headers] == [("i", r.value[1:])] for r in rows)
    assert {r.timestampType for r in rows} == {0}
    # Offsets are dense per partition and keys stay on one partition.
    by_part: dict[int, list[int]] = {}
    for r in rows:
        by_part.setdefault(r.partition, []).append(r.offset)
    assert all(sorted(v) == list(range(len(v))) for v in by_part.values())
    assert df.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
        "timestampType:int,headers:array<struct<key:string,value:binary>>,tag:string>"
    )


def test_max_records_per_partition_splits_ranges(spark: Any, stack: Stack, client: Client) -> None:
    topic = _topic(client, partitions=1)
    _produce(client, topic, 100)
    df = _read(spark, stack, topic, maxRecordsPerPartition="30")
    assert df.rdd.getNumPartitions() == 4  # 30 + 30 + 30 + 10
    assert sorted(r.offset for r in df.collect()) == list(range(100))


def test_filter_is_applied_on_the_broker(spark: Any, stack: Stack, client: Client) -> None:
    topic = _topic(client)
    _produce(client, topic, 200)
    rows = _read(spark, stack, topic, filter="odd").collect()
    assert len(rows) == 100
    assert {r.tag for r in rows} == {"odd"}


def test_explicit_offset_range(spark: Any, stack: Stack, client: Client) -> None:
    topic = _topic(client, partitions=1)
    _produce(client, topic, 50)
    rows = _read(
        spark,
        stack,
        topic,
        startingOffsets=f'{{"{topic}": {{"0": 10}}}}',
        endingOffsets=f'{{"{topic}": {{"0": 20}}}}',
    ).collect()
    assert sorted(r.offset for r in rows) == list(range(10, 20))


@pytest.mark.parametrize(
    ("options", "code"),
    [
        ({"topic": "no-such-topic"}, "UNKNOWN_TOPIC_OR_PARTITION"),
        ({"startingOffsets": "{not json"}, "INVALID_ARGUMENT"),
        ({"bootstrap": "127.0.0.1:1"}, "REQUEST_TIMED_OUT: coordinator unreachable"),
    ],
)
def test_bad_options_fail_at_planning_time(
    spark: Any, stack: Stack, client: Client, options: dict[str, str], code: str
) -> None:
    topic = _topic(client, partitions=1)
    base = {"bootstrap": stack.bootstrap, "topic": topic, "requestTimeoutMs": "2000", **options}
    reader = spark.read.format("sluice")
    for k, v in base.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception, match=code):
        reader.load().collect()


def _stream_once(spark: Any, stack: Stack, topic: str, out: Path, ckpt: Path, **options: str) -> None:
    reader = (
        spark.readStream.format("sluice")
        .option("bootstrap", stack.bootstrap)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .selectExpr("partition", "offset", "cast(value as string) as value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None


def test_available_now_three_runs_exactly_once(
    spark: Any, stack: Stack, client: Client, tmp_path: Path
) -> None:
    topic = _topic(client)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    expected: list[bytes] = []
    for run in range(3):
        expected += [v for v, _ in _produce(client, topic, 100, start=run * 100)]
        _stream_once(spark, stack, topic, out, ckpt)
        values = [r.value for r in spark.read.parquet(str(out)).collect()]
        assert sorted(values) == sorted(v.decode() for v in expected)  # every record exactly once
    # A restart from the checkpoint with nothing new re-reads nothing.
    _stream_once(spark, stack, topic, out, ckpt)
    assert spark.read.parquet(str(out)).count() == 300


def test_max_records_per_trigger_bounds_micro_batches(
    spark: Any, stack: Stack, client: Client, tmp_path: Path
) -> None:
    topic = _topic(client)
    _produce(client, topic, 250)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    _stream_once(spark, stack, topic, out, ckpt, maxRecordsPerTrigger="60")
    assert spark.read.parquet(str(out)).count() == 250
    commits = sorted((ckpt / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    batches = [p for p in commits if p.name.isdigit()]
    assert len(batches) >= 5  # 250 records at most 60 per trigger
    offsets_dir = ckpt / "offsets"
    import json

    from sluice.spark.epochs import split_offsets

    ends = []
    for p in sorted((q for q in offsets_dir.iterdir() if q.name.isdigit()), key=lambda q: int(q.name)):
        ends.append(sum(split_offsets(json.loads(p.read_text().splitlines()[-1]))[0].values()))
    sizes = [b - a for a, b in zip([0, *ends], ends, strict=False)]
    assert max(sizes) <= 60
    assert sum(sizes) == 250


def _retained_topic(client: Client) -> str:
    name = f"retained-{uuid.uuid4().hex[:8]}"
    client.admin.create_topic(name, partitions=1, config={"segment_bytes": 2048, "retention_bytes": 4096})
    return name


def _wait_for_log_start(client: Client, topic: str, above: int) -> int:
    import time

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        start = client.list_offsets(topic, "earliest")[0]
        if start > above:
            return start
        time.sleep(0.1)
    raise AssertionError("retention did not run")


def test_data_deleted_by_retention_fails_or_is_skipped(
    spark: Any, stack: Stack, client: Client, tmp_path: Path
) -> None:
    topic = _retained_topic(client)
    _produce(client, topic, 20)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    _stream_once(spark, stack, topic, out, ckpt)
    assert spark.read.parquet(str(out)).count() == 20
    # Much more data arrives, in many small batches (retention deletes whole segments),
    # and retention deletes what the query has not read yet.
    for chunk in range(20):
        _produce(client, topic, 20, start=20 + chunk * 20)
    log_start = _wait_for_log_start(client, topic, above=20)
    reader = spark.readStream.format("sluice").option("bootstrap", stack.bootstrap).option("topic", topic)
    query = (
        reader.load()
        .selectExpr("offset")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match=r"OFFSET_OUT_OF_RANGE: records 20\.\.\d+ .* failOnDataLoss=false"):
        query.awaitTermination(120)
    # With failOnDataLoss=false the query skips the lost range and reads on from the log start.
    _stream_once(spark, stack, topic, out, ckpt, failOnDataLoss="false")
    offsets = sorted(r.offset for r in spark.read.parquet(str(out)).collect())
    assert offsets[:20] == list(range(20))
    assert offsets[20] >= log_start
    assert offsets[-1] == 419


def test_stream_picks_up_partitions_added_while_running(
    spark: Any, stack: Stack, client: Client, tmp_path: Path
) -> None:
    topic = _topic(client, partitions=2)
    _produce(client, topic, 50)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    _stream_once(spark, stack, topic, out, ckpt)
    grown = client.admin.add_partitions(topic, 4)
    assert [p.partition for p in grown.partitions] == [0, 1, 2, 3]
    with client.producer(topic) as producer:
        for i in range(40):
            producer.send(f"n{i}".encode(), partition=2 + i % 2)
        producer.flush()
    _stream_once(spark, stack, topic, out, ckpt)
    rows = spark.read.parquet(str(out)).collect()
    assert len(rows) == 90
    assert sum(1 for r in rows if r.partition in (2, 3)) == 40


def test_commit_to_group_makes_spark_progress_visible_as_group_offsets(
    spark: Any, stack: Stack, client: Client, tmp_path: Path
) -> None:
    topic = _topic(client, partitions=2)
    _produce(client, topic, 60)
    group = f"spark-{uuid.uuid4().hex[:6]}"
    _stream_once(spark, stack, topic, tmp_path / "out", tmp_path / "ckpt", commitToGroup=group)
    first = client.list_offsets(topic, "latest")
    # Spark hands a micro-batch's end offsets to its source's commit() when it runs the next
    # batch: the progress of the first run is committed by the second.
    _produce(client, topic, 10, start=60)
    _stream_once(spark, stack, topic, tmp_path / "out", tmp_path / "ckpt", commitToGroup=group)
    assert client.admin.group_offsets(group) == {(topic, p): first[p] for p in (0, 1)}


def test_a_checkpoint_written_before_leader_epochs_resumes_exactly_once(
    spark: Any, stack: Stack, client: Client, tmp_path: Path
) -> None:
    """Offsets checkpointed as plain numbers (before leader epochs, docs/spark.md "Offsets and leader
    epochs") still load: the query resumes where they say, and its next offsets carry epochs."""
    import json

    topic = _topic(client, partitions=2)
    _produce(client, topic, 40)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    _stream_once(spark, stack, topic, out, ckpt)
    files = [p for p in (ckpt / "offsets").iterdir() if p.name.isdigit()]
    assert files
    for p in files:  # rewrite every offset as an older Sluice wrote it: {"topic/partition": offset}
        lines = p.read_text().splitlines()
        offsets = json.loads(lines[-1])
        assert all(isinstance(v, dict) and v["leaderEpoch"] >= 0 for v in offsets.values())
        lines[-1] = json.dumps({k: v["offset"] for k, v in offsets.items()})
        p.write_text("\n".join(lines))
    _produce(client, topic, 40, start=40)
    _stream_once(spark, stack, topic, out, ckpt)
    values = sorted(r.value for r in spark.read.parquet(str(out)).collect())
    assert values == sorted(f"v{i}" for i in range(80))  # every record exactly once
    newest = max((p for p in (ckpt / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    assert all(isinstance(v, dict) for v in json.loads(newest.read_text().splitlines()[-1]).values())
