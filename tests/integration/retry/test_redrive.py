"""sluice dlq redrive: exactly once at the target across kill -9 (one between a write's acknowledgement
and the cursor save), only the failed group sees the records, and bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Protocol

from sluice import Client
from sluice.cli.dlq_redrive import CRASH_ENV
from sluice.retry.levels import (
    H_COUNT,
    H_DLQ_SOURCE,
    H_OFFSET,
    H_PARTITION,
    H_REDRIVE_COUNT,
    H_TOPIC,
    dlq_topic,
    retry_topic,
)
from tests.integration.retry.conftest import CFG, RetryCluster, read_all

ROOT = Path(__file__).resolve().parents[3]
RECORDS = 5_000
OVER_CAP = 50


class Bootstrapped(Protocol):
    @property
    def bootstrap(self) -> str: ...


def dlq_process(
    cluster: Bootstrapped, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``sluice dlq ARGS`` as a process of its own (so a kill -9 is a real one)."""
    return subprocess.Popen(
        [sys.executable, "-m", "sluice", "--bootstrap", cluster.bootstrap, "dlq", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT / "services"), **(env or {})},
        cwd=ROOT,
    )


def dlq_run(cluster: Bootstrapped, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = dlq_process(cluster, *args, env=env)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out.decode(), err.decode()


def _fill(client: Client, group: str, topic: str) -> None:
    """A DLQ as 17 failures would leave it (written directly: failing 5,000 records 17 times is slow)."""
    with client.producer(dlq_topic(group)) as p:
        for i in range(RECORDS + OVER_CAP):
            headers = {H_TOPIC: topic.encode(), H_PARTITION: b"0", H_OFFSET: str(i).encode(), H_COUNT: b"17"}
            if i >= RECORDS:
                headers[H_REDRIVE_COUNT] = b"3"  # redriven 3 times already: stays
            p.send(f"v{i}".encode(), headers=headers, partition=0)
        p.flush()


def test_redrive_exactly_once_across_kills(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "dr"), cluster.group()
    client = cluster.client()
    client.consumer(group, [topic], retry_delay_levels="100ms 200ms 300ms", **CFG).close()  # makes the topics
    with client.producer(topic) as p:
        p.send(b"original").result(10)
    _fill(client, group, topic)

    # 1. Killed between the acknowledgement of the 4th batch (2,000 records) and its cursor save.
    code, _, err = dlq_run(cluster, "redrive", "--group", group, env={CRASH_ENV: "2000"})
    assert code == -9, err[-2000:]
    assert len(read_all(client, retry_topic(group), partitions=3)) == 2000

    # 2. Throttled, killed from outside mid-way.
    proc = dlq_process(cluster, "redrive", "--group", group, "--rate", "1000/s")
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline().decode()
        m = re.search(r"read (\d+)/", line)
        if m and int(m.group(1)) >= 1000:
            break
        assert line or proc.poll() is None, "the redrive ended before it could be killed"
    proc.kill()
    proc.communicate(timeout=10)  # reaps it and closes its pipes

    # 3. To the end.
    code, out, err = dlq_run(cluster, "redrive", "--group", group)
    assert code == 0, err[-2000:]
    assert "of " in out

    written = read_all(client, retry_topic(group), partitions=3, timeout=30)
    sources = Counter(r.headers[H_DLQ_SOURCE] for r in written)
    duplicates = {k: n for k, n in sources.items() if n > 1}
    assert duplicates == {}, f"{len(duplicates)} records redriven twice"
    assert len(written) == RECORDS, "every record under the cap arrived exactly once"
    assert set(sources) == {f"{dlq_topic(group)}/0/{i}".encode() for i in range(RECORDS)}
    r = written[0]
    assert r.headers[H_REDRIVE_COUNT] == b"1"
    assert r.headers[H_TOPIC] == topic.encode()
    assert r.headers[H_COUNT] == b"0"
    assert all(x.partition == 0 for x in written)
    # Other groups of the original topic saw none of them: the topic holds its one original record.
    assert client.list_offsets(topic, "latest") == {0: 1}

    # A second redrive finds nothing left to move (the cursor is at the end).
    code, out, _ = dlq_run(cluster, "redrive", "--group", group)
    assert code == 0
    assert "redrove 0 of 0" in out


def test_redrive_bad_input_and_dry_run(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "db"), cluster.group()
    client = cluster.client()
    client.consumer(group, [topic], retry_delay_levels="100ms 200ms 300ms", **CFG).close()
    with client.producer(dlq_topic(group)) as p:
        p.send(b"x", headers={H_TOPIC: topic.encode(), H_PARTITION: b"0", H_OFFSET: b"0"}).result(10)

    code, _, err = dlq_run(cluster, "redrive", "--dlq-topic", topic)
    assert code == 1
    assert "NOT_A_DLQ_TOPIC" in err
    assert "Traceback" not in err
    code, _, err = dlq_run(cluster, "redrive", "--group", group, "--to", "original")
    assert code == 2
    assert "--yes" in err
    code, _, err = dlq_run(cluster, "redrive", "--group", group, "--rate", "fast")
    assert code == 2
    assert "--rate" in err
    # Push subscriptions redrive too (tests/integration/push/test_redrive_subscription.py); one without
    # dead letters has no DLQ topic to read.
    code, _, err = dlq_run(cluster, "redrive", "--subscription", "s", "--topic", topic)
    assert code == 1
    assert f"{topic}.s.DLQ' does not exist" in err

    code, out, _ = dlq_run(cluster, "redrive", "--group", group, "--dry-run")
    assert code == 0
    assert "would redrive 1 of 1" in out
    assert read_all(client, retry_topic(group), partitions=3) == []

    code, out, _ = dlq_run(cluster, "peek", "--group", group)
    assert code == 0
    assert f"from {topic}[0]@0" in out
    code, out, _ = dlq_run(cluster, "list")
    assert dlq_topic(group) in out

    # --to original, confirmed: back in the original topic, once.
    code, out, err = dlq_run(cluster, "redrive", "--group", group, "--to", "original", "--yes")
    assert code == 0, err
    assert [r.value for r in read_all(client, topic)] == [b"x"]

    code, out, err = dlq_run(cluster, "purge", "--group", group, "--yes")
    assert code == 0, err
    assert client.list_offsets(dlq_topic(group), "latest") == {0: 0}


def test_redrive_filter_and_rate(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "df"), cluster.group()
    client = cluster.client()
    client.consumer(group, [topic], retry_delay_levels="100ms 200ms 300ms", **CFG).close()
    with client.producer(dlq_topic(group)) as p:
        for i, tag in enumerate(["a", "b", None, "a"]):
            p.send(f"v{i}".encode(), tag=tag, headers={H_TOPIC: topic.encode(), H_OFFSET: str(i).encode()})
        p.flush()
    code, out, _ = dlq_run(cluster, "redrive", "--group", group, "--filter", "a", "--dry-run")
    assert code == 0
    assert "would redrive 2 of 4" in out
    started = time.monotonic()
    code, out, err = dlq_run(cluster, "redrive", "--group", group, "--filter", "a", "--rate", "1/s")
    assert code == 0, err
    assert time.monotonic() - started >= 1.5, "2 records at 1/s take at least 2 s"
    assert "filtered 2" in err
    assert [r.value for r in read_all(client, retry_topic(group), partitions=3)] == [b"v0", b"v3"]
