"""The jobs in spark-jobs/ produce what a direct computation over the produced data says."""

from __future__ import annotations

import collections
import sys
import uuid
from pathlib import Path
from typing import Any

from sluice.client.client import Client

from .conftest import Stack, jobs_dir

MINUTE_MS = 60_000
BASE_MS = 1_700_000_040_000 - 1_700_000_040_000 % MINUTE_MS  # a minute boundary


def _import_job(name: str) -> Any:
    if str(jobs_dir()) not in sys.path:
        sys.path.insert(0, str(jobs_dir()))
    return __import__(name)


def test_tag_counts_equals_direct_counts(spark: Any, stack: Stack, client: Client, tmp_path: Path) -> None:
    topic = f"tags-{uuid.uuid4().hex[:8]}"
    client.admin.create_topic(topic, partitions=4)
    expected: collections.Counter[tuple[int, str]] = collections.Counter()
    with client.producer(topic) as producer:
        for i in range(600):
            minute = i % 3
            tag = ["tagA", "tagB", None][i % 5 % 3]
            ts = BASE_MS + minute * MINUTE_MS + (i * 997) % MINUTE_MS
            producer.send(f"v{i}".encode(), key=f"k{i}".encode(), tag=tag, timestamp=ts)
            expected[(BASE_MS + minute * MINUTE_MS, tag or "")] += 1
        # A late-arriving clock tick: moves the watermark past the three minutes so they are final.
        producer.send(b"tick", tag="tick", timestamp=BASE_MS + 30 * MINUTE_MS)
        producer.flush()
    out, ckpt = tmp_path / "counts", tmp_path / "ckpt"
    job = _import_job("tag_counts")
    job.main(
        [
            "--bootstrap",
            stack.bootstrap,
            "--topic",
            topic,
            "--output",
            str(out),
            "--checkpoint",
            str(ckpt),
            "--available-now",
            "--watermark",
            "1 minute",
        ]
    )
    rows = spark.read.parquet(str(out)).collect()
    got = {(int(r.minute.timestamp() * 1000), r.tag): r["count"] for r in rows}
    assert got == dict(expected)


def test_export_copies_the_range_partitioned_by_date(
    spark: Any, stack: Stack, client: Client, tmp_path: Path
) -> None:
    topic = f"export-{uuid.uuid4().hex[:8]}"
    client.admin.create_topic(topic, partitions=2)
    day = 86_400_000
    with client.producer(topic) as producer:
        for i in range(100):
            producer.send(f"v{i}".encode(), tag="t", timestamp=BASE_MS + (i % 2) * day)
        producer.flush()
    out = tmp_path / "export"
    job = _import_job("export")
    job.main(["--bootstrap", stack.bootstrap, "--topic", topic, "--output", str(out)])
    dates = sorted(p.name for p in out.iterdir() if p.name.startswith("date="))
    assert len(dates) == 2
    df = spark.read.parquet(str(out))
    assert df.count() == 100
    assert sorted(r.value for r in df.select("value").collect()) == sorted(
        f"v{i}".encode() for i in range(100)
    )
