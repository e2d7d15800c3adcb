"""Delays of days, under the scheduler's injectable clock, across restarts; and the typed refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sluice.errors import DelayBeyondRetention, DelayTooLong, InvalidArgument
from tests.integration.delay.conftest import Arrival, DelayCluster, collect

DAY_MS = 86_400_000
#: Due times (days ahead) of the records; the clock is stepped to just past each group.
GROUPS = (1, 3, 10, 40)
PER_GROUP = 25


def _check_step(arrivals: list[Arrival], clock_ms: int, expect: int) -> None:
    assert len(arrivals) == expect, f"{len(arrivals)} delivered, expected {expect}"
    assert len({a.record.value for a in arrivals}) == expect, "a record was delivered twice"
    early = [a for a in arrivals if a.received_ms < a.due]
    assert not early, f"{len(early)} delivered before due"
    assert all(a.due <= clock_ms for a in arrivals)


@pytest.mark.scheduler_args("--max-delay", "50d")
def test_days_long_delays_cross_buckets_and_restarts(delay_cluster: DelayCluster) -> None:
    client = delay_cluster.client()
    topic = delay_cluster.topic(2, config={"retention_ms": 60 * DAY_MS})
    t0 = time.time_ns() // 1_000_000
    with client.producer(topic, max_delay=timedelta(days=50)) as producer:
        for g, days in enumerate(GROUPS):
            for i in range(PER_GROUP):
                due = t0 + days * DAY_MS + i * 600_000  # spread over many 10 s buckets (4 hours)
                producer.send(
                    f"{days}d-{i}".encode(),
                    key=str(i).encode(),
                    deliver_at=datetime.fromtimestamp(due / 1000, UTC),
                )
            assert g < len(GROUPS)
        producer.flush(30)
    # Nothing is due yet: nothing arrives.
    assert collect(client, topic, 2, 1, timeout=1.5) == []
    restarts = (
        delay_cluster.restart_scheduler,
        delay_cluster.kill_scheduler,
        delay_cluster.restart_broker,
        delay_cluster.restart_scheduler,
    )
    delivered = 0
    for days, restart in zip(GROUPS, restarts, strict=True):
        # Step the clock to just past this group's last due time, with a restart in between.
        offset = days * DAY_MS + PER_GROUP * 600_000 + 1_000 + (t0 - time.time_ns() // 1_000_000)
        restart()
        delay_cluster.set_clock_offset(offset)
        if delay_cluster.scheduler.process.poll() is not None:
            delay_cluster.restart_scheduler()
        delivered += PER_GROUP
        arrivals = collect(client, topic, 2, delivered, timeout=30, clock_offset_ms=offset)
        clock_ms = time.time_ns() // 1_000_000 + offset
        _check_step(arrivals, clock_ms, delivered)
        # And nothing more within a moment (the next group is days ahead).
        assert len(collect(client, topic, 2, delivered + 1, timeout=1.0, clock_offset_ms=offset)) == delivered


def test_typed_refusals(delay_cluster: DelayCluster) -> None:
    client = delay_cluster.client()
    short = delay_cluster.topic(1, config={"retention_ms": 3_600_000})
    with client.producer(short) as producer:
        with pytest.raises(DelayTooLong, match="maximum delay of 604800 s"):
            producer.send(b"x", deliver_after=timedelta(days=8))
        with pytest.raises(DelayBeyondRetention, match="retention of 3600 s"):
            producer.send(b"x", deliver_after=timedelta(hours=2))
        with pytest.raises(InvalidArgument, match="timezone-aware"):
            producer.send(b"x", deliver_at=datetime(2030, 1, 1))
        with pytest.raises(InvalidArgument, match="not both"):
            producer.send(b"x", deliver_at=datetime.now(UTC), deliver_after=timedelta(seconds=1))
        with pytest.raises(InvalidArgument, match="reserved"):
            producer.send(b"x", headers={"sluice-target": b"t"}, deliver_after=timedelta(seconds=1))
        # Nothing refused was stored: the topic stays empty.
        producer.send(b"ok", deliver_after=timedelta(milliseconds=10)).result(10)
    arrivals = collect(client, short, 1, 2, timeout=3)
    assert [a.record.value for a in arrivals] == [b"ok"]


def _sluice(cluster: DelayCluster, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", "--bootstrap", cluster.coordinator.address, *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "services")},
        check=False,
    )


def test_cli_produce_deliver_after(delay_cluster: DelayCluster) -> None:
    client = delay_cluster.client()
    topic = delay_cluster.topic(1)
    sent_ms = time.time_ns() // 1_000_000
    done = _sluice(delay_cluster, "produce", topic, "--deliver-after", "2s", "-q", stdin=b"a\nb\nc\n")
    assert done.returncode == 0, done.stderr.decode()
    arrivals = collect(client, topic, 1, 3, timeout=20)
    assert [a.record.value for a in arrivals] == [b"a", b"b", b"c"]
    assert all(a.received_ms >= a.due >= sent_ms + 2000 for a in arrivals)
    refused = _sluice(delay_cluster, "produce", topic, "--deliver-after", "8d", stdin=b"x\n")
    assert refused.returncode == 1
    assert "maximum delay of 604800 s" in refused.stderr.decode()
    assert "Traceback" not in refused.stderr.decode()
