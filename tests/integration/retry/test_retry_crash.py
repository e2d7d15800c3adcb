"""kill -9 between the retry write and the commit of the original: no duplicate, nothing lost."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sluice.codec.batch import Record
from sluice.retry.levels import H_SOURCE, retry_info, retry_topic
from tests.integration.retry.conftest import CFG, RetryCluster, read_all

LEVELS = "100ms 200ms 500ms 500ms 500ms"


def test_kill_between_retry_write_and_commit_delivers_once(cluster: RetryCluster) -> None:
    topic, group = cluster.topic(1, "rc"), cluster.group()
    client = cluster.client()
    with client.producer(topic) as p:
        for i in range(20):
            p.send(str(i).encode())
        p.flush()
    script = Path(__file__).with_name("crash_member.py")
    proc = subprocess.run(
        [sys.executable, str(script), cluster.bootstrap, group, topic, LEVELS, "5"],
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    written = read_all(client, retry_topic(group), partitions=5)
    assert len(written) == 1, "the dead member wrote its retry before dying"
    assert written[0].headers[H_SOURCE] == f"{topic}/0/5".encode()

    # The next member starts from offset 0 (nothing was committed) and meets record 5 again.
    consumer = client.consumer(group, [topic], retry_delay_levels=LEVELS, **CFG)
    seen: dict[bytes, int] = {}
    retried: list[Record] = []
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and (len(seen) < 20 or not retried):
        for r in consumer.poll(0.1):
            seen[r.value] = seen.get(r.value, 0) + 1
            if r.topic == retry_topic(group):
                retried.append(r)
    consumer.commit()
    # Any late duplicate would come within the level's delay.
    for r in consumer.poll(1.5):
        seen[r.value] = seen.get(r.value, 0) + 1
    consumer.close()
    assert sorted(seen, key=int) == [str(i).encode() for i in range(20)]
    duplicates = {v: n for v, n in seen.items() if n > 1}
    assert duplicates == {}, f"delivered more than once: {duplicates}"
    assert len(retried) == 1
    info = retry_info(retried[0].headers)
    assert info is not None
    assert (info.topic, info.offset, info.count) == (topic, 5, 1)
    assert len(read_all(client, retry_topic(group), partitions=5)) == 1, "no second retry written"


def test_the_same_source_is_not_written_twice(cluster: RetryCluster) -> None:
    """The other half: a second member that fails the record again (it was not skipped because it
    met the record before the retry existed) writes no second retry."""
    topic, group = cluster.topic(1, "rd2"), cluster.group()
    client = cluster.client()
    with client.producer(topic) as p:
        p.send(b"x").result(10)
    consumer = client.consumer(group, [topic], retry_delay_levels=LEVELS, enable_auto_commit=False, **CFG)
    record = None
    deadline = time.monotonic() + 30
    while record is None and time.monotonic() < deadline:
        got = consumer.poll(0.1)
        record = got[0] if got else None
    assert record is not None
    first = consumer.reconsume_later(record)
    again = consumer._retry.send(record, None, None)  # type: ignore[union-attr]  # a crash's re-send
    assert not first.deduplicated
    assert again.deduplicated
    consumer.close()
    assert len(read_all(client, retry_topic(group), partitions=5)) == 1
