"""kill -9 in the middle of delayed deliveries: the broker, then the scheduler. None lost, none
duplicated, none early."""

from __future__ import annotations

import json
import random
import re
import signal
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from sluice import Client
from sluice.broker.schedule.trace import TRACE_ENV
from sluice.errors import SluiceError
from tests.harness import run_redis
from tests.integration.delay.conftest import Arrival, DelayCluster, start_delay_cluster

RECORDS = 4_000
SPREAD_MS = 8_000
PARTITIONS = 2


class Collector(threading.Thread):
    """Reads the target topic from its start, through broker restarts, until stopped."""

    def __init__(self, client: Client, topic: str) -> None:
        super().__init__(daemon=True)
        self.client, self.topic = client, topic
        self.arrivals: list[Arrival] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        positions = {(self.topic, p): 0 for p in range(PARTITIONS)}
        while not self.stopping.is_set():
            try:
                with self.client.fetcher(positions, max_wait_ms=50) as fetcher:
                    while not self.stopping.is_set():
                        records = fetcher.fetch()
                        now = time.time_ns() // 1_000_000
                        self.arrivals += (Arrival(r, now) for r in records)
                        for r in records:
                            positions[(r.topic, r.partition)] = r.offset + 1
            except SluiceError:
                self.stopping.wait(0.2)


def _wait_for(cond: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_broker_and_scheduler_kill9_lose_none_duplicate_none_early_none(delay_cluster: DelayCluster) -> None:
    client = delay_cluster.client()
    topic = delay_cluster.topic(PARTITIONS)
    rng = random.Random(9)
    with client.producer(topic) as producer:
        futures = [
            producer.send(str(i).encode(), deliver_after=timedelta(milliseconds=rng.randrange(SPREAD_MS)))
            for i in range(RECORDS)
        ]
        producer.flush(30)
        assert all(f.exception(0) is None for f in futures)
    collector = Collector(delay_cluster.client(), topic)
    collector.start()
    try:
        time.sleep(2.0)  # deliveries under way
        delay_cluster.kill_broker()
        time.sleep(1.0)
        delay_cluster.restart_broker()
        assert _wait_for(lambda: len(collector.arrivals) > RECORDS // 2, 30)
        delay_cluster.kill_scheduler()  # mid-delivery: some sent, not all marked done
        delay_cluster.restart_scheduler()
        assert _wait_for(lambda: len(collector.arrivals) >= RECORDS, 60), f"{len(collector.arrivals)} arrived"
        time.sleep(1.5)  # a duplicate would arrive now
    finally:
        collector.stopping.set()
        collector.join(10)
    values = [int(a.record.value) for a in collector.arrivals]
    assert sorted(set(values)) == list(range(RECORDS)), "a record was lost"
    assert len(values) == RECORDS, f"{len(values) - RECORDS} duplicate deliveries"
    early = [a for a in collector.arrivals if a.received_ms < a.due]
    assert not early, f"{len(early)} delivered early"
    # Keyless delayed records spread over the partitions (runs of 256), as keyless immediate ones do.
    assert {a.record.partition for a in collector.arrivals} == set(range(PARTITIONS))


def _check_once_none_early(arrivals: list[Arrival]) -> None:
    values = [int(a.record.value) for a in arrivals]
    assert sorted(set(values)) == list(range(RECORDS)), "a record was lost"
    assert len(values) == RECORDS, f"{len(values) - RECORDS} duplicate deliveries"
    early = [a for a in arrivals if a.received_ms < a.due]
    assert not early, f"{len(early)} delivered early"


def test_broker_kill9_with_delivery_batches_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker answers late (SIGSTOP), so the scheduler keeps sending and several delivery batches are
    in flight, then dies (kill -9) with them unanswered: none lost, none twice, none early. The
    scheduler's own trace shows the batches that were in flight together."""
    with run_redis(appendonly=True) as redis, tempfile.TemporaryDirectory(prefix="sluice-delay-") as d:
        trace_file = Path(d) / "trace.jsonl"
        monkeypatch.setenv(TRACE_ENV, str(trace_file))
        cluster = start_delay_cluster(redis, Path(d))
        try:
            client = cluster.client()
            topic = cluster.topic(PARTITIONS)
            rng = random.Random(15)
            with client.producer(topic) as producer:
                for i in range(RECORDS):
                    producer.send(
                        str(i).encode(), deliver_after=timedelta(milliseconds=rng.randrange(SPREAD_MS))
                    )
                producer.flush(30)
            collector = Collector(cluster.client(), topic)
            collector.start()
            try:
                time.sleep(2.0)  # deliveries under way
                cluster.broker.process.send_signal(signal.SIGSTOP)
                time.sleep(0.6)  # answers late: batches pile up in flight
                cluster.kill_broker()  # with them unanswered
                cluster.restart_broker()
                assert _wait_for(lambda: len(collector.arrivals) >= RECORDS, 90), f"{len(collector.arrivals)}"
                time.sleep(1.5)  # a duplicate would arrive now
            finally:
                collector.stopping.set()
                collector.join(10)
            _check_once_none_early(collector.arrivals)
        finally:
            cluster.stop()
        batches = [e for e in map(json.loads, trace_file.read_text().splitlines()) if e["kind"] == "batch"]
        assert max(e["in_flight"] for e in batches) >= 2, "no delivery batch was in flight behind another"


@pytest.mark.scheduler_args("--crash-after-deliveries", "500")
def test_crash_between_append_and_done_mark_never_duplicates(delay_cluster: DelayCluster) -> None:
    """The scheduler dies right after records reached their topic and before it marked them done; after
    the restart its recovery finds them there, and no record arrives twice."""
    client = delay_cluster.client()
    topic = delay_cluster.topic(PARTITIONS)
    with client.producer(topic) as producer:
        for i in range(2_000):
            producer.send(str(i).encode(), deliver_after=timedelta(milliseconds=200 + i))
        producer.flush(30)
    assert delay_cluster.scheduler.process.wait(60) == 137
    delay_cluster.restart_scheduler(drop=("--crash-after-deliveries",))
    collector = Collector(delay_cluster.client(), topic)
    collector.start()
    try:
        assert _wait_for(lambda: len(collector.arrivals) >= 2_000, 60), f"{len(collector.arrivals)} arrived"
        time.sleep(1.5)
    finally:
        collector.stopping.set()
        collector.join(10)
    values = [int(a.record.value) for a in collector.arrivals]
    assert len(values) == len(set(values)) == 2_000
    found = re.search(r"recovery found (\d+) delivered", delay_cluster.scheduler.log())
    assert found is not None
    assert int(found.group(1)) > 0, "the restart did not find the crashed batch in its topic"
