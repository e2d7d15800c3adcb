"""The Spark source reads compressed batches (docs/compression.md): the executors' Arrow path inflates
each batch and builds its columns from the plain batch; the broker still filters them."""

from __future__ import annotations

import uuid
from typing import Any

from sluice.client.client import Client
from sluice.codec.batch.compression import CODECS

from .conftest import Stack


def test_spark_reads_zstd_and_lz4_batches_and_the_broker_filters_them(
    spark: Any, stack: Stack, client: Client
) -> None:
    topic = f"spark-cz-{uuid.uuid4().hex[:8]}"
    client.admin.create_topic(topic, partitions=2)
    sent: list[tuple[bytes, bytes, str, int, int]] = []
    # One topic, both codecs (and their batches interleaved in the log): each batch names its own codec.
    for codec, start in (("zstd", 0), ("lz4", 100), ("zstd", 200)):
        with client.producer(topic, compression=codec) as producer:
            for i in range(start, start + 100):
                tag = "even" if i % 2 == 0 else "odd"
                value = b'{"order": %d, "status": "paid"}' % i
                producer.send(value, key=b"k%d" % i, tag=tag, headers={"i": b"%d" % i}, partition=i % 2)
                sent.append((value, b"k%d" % i, tag, i % 2, i))
            producer.flush()
    reader = spark.read.format("sluice").option("bootstrap", stack.bootstrap).option("topic", topic)
    rows = reader.option("includeHeaders", "true").load().collect()
    got = sorted(
        (r.value, r.key, r.tag, r.partition, int(r.headers[0].value)) for r in rows if r.headers[0].key == "i"
    )
    assert got == sorted(sent)
    assert sorted(r.offset for r in rows if r.partition == 0) == list(range(150))
    odd = reader.option("filter", "odd").load().collect()
    assert sorted(r.value for r in odd) == sorted(v for v, _, tag, _, _ in sent if tag == "odd")


def test_the_sink_writes_compressed_batches_the_source_reads_back(
    spark: Any, stack: Stack, client: Client
) -> None:
    topic = f"spark-sz-{uuid.uuid4().hex[:8]}"
    client.admin.create_topic(topic, partitions=1)
    note = b"x" * 40
    rows = [(b"k%d" % i, b'{"order": %d, "status": "paid", "note": "%s"}' % (i, note)) for i in range(200)]
    spark.createDataFrame(rows, "key binary, value binary").coalesce(1).write.format("sluice").option(
        "bootstrap", stack.bootstrap
    ).option("topic", topic).option("compression", "zstd").mode("append").save()
    back = spark.read.format("sluice").option("bootstrap", stack.bootstrap).option("topic", topic).load()
    assert sorted((r.key, r.value) for r in back.collect()) == sorted(rows)
    # Stored as the sink's producer sent it: every batch on disk names zstd in its attributes (byte 29).
    log = b"".join(p.read_bytes() for p in sorted((stack.data_dir / f"{topic}-0").glob("*.log")))
    assert log, "no segment written"
    at, codecs = 0, set()
    while at < len(log):
        codecs.add(log[at + 29] & 0x07)
        at += int.from_bytes(log[at + 8 : at + 12], "little")
    assert codecs == {CODECS["zstd"]}
