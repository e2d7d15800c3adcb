"""The background scrub with real processes (docs/replication.md, "The scrub"): three brokers, a factor-3
topic with small segments, every replica in sync; then one bit flipped in a record value in the middle of
a sealed segment of a *follower*, which nobody reads (consumers read the leader). The follower's scrub
finds it (metric ``sluice_broker_scrub_damaged_batches_total``), reports it (the controller takes the
follower out of the ISR), the follower truncates below the damage and re-fetches it from the leader, and
rejoins: its log matches the leader's byte for byte again. With the scrub off, nothing finds it (the test
of that: the damage is still there after the same wait)."""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import pytest

from sluice.client import Client
from sluice.codec.batch import iter_headers
from sluice.errors import InvalidReplicationFactor

from .test_replication import Cluster, cluster_of, until


def _flip_value_bit(directory: Path) -> None:
    """One bit of a record value in the middle batch of a middle (sealed) segment, in place."""
    segments = sorted(directory.glob("*.log"))
    assert len(segments) >= 3, "the test needs sealed segments"
    sealed = segments[len(segments) // 2]
    batches = list(iter_headers(sealed.read_bytes()))
    pos, header = batches[len(batches) // 2]
    with sealed.open("r+b") as f:
        f.seek(pos + header.length - 2)
        byte = f.read(1)[0]
        f.seek(pos + header.length - 2)
        f.write(bytes([byte ^ 0x10]))


def _metric(cluster: Cluster, broker_id: int, name: str) -> float:
    metrics = cluster.brokers[broker_id].proc.metrics
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def _setup(cluster: Cluster) -> tuple[int, int]:
    deadline = time.monotonic() + 30
    with Client(cluster.coordinator.address) as client:
        while True:
            try:
                client.admin.create_topic(
                    "scrub", config={"segment_bytes": 16 * 1024}, replication_factor=3, min_insync_replicas=2
                )
                break
            except InvalidReplicationFactor:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with client.producer("scrub") as producer:
            for chunk in range(30):  # 30 batches of about 5.5 KB: 10 segments of 16 KB
                for f in [producer.send(b"v%05d" % (chunk * 50 + i) + os.urandom(100)) for i in range(50)]:
                    f.result(timeout=30)
    leader = cluster.partition("scrub").broker_id
    follower = (leader + 1) % 3
    until(lambda: cluster.segments(follower, "scrub") == cluster.segments(leader, "scrub"), "in sync")
    return leader, follower


def test_the_scrub_finds_rot_in_a_follower_copy_nobody_reads_and_it_heals(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_BROKER_SCRUB_INTERVAL", "1s")  # a pass every second: the flip is found soon
    with cluster_of(tmp_path) as cluster:
        leader, follower = _setup(cluster)
        good = cluster.segments(leader, "scrub")
        _flip_value_bit(cluster.data / f"b{follower}" / "scrub-0")
        assert cluster.segments(follower, "scrub") != good
        until(
            lambda: _metric(cluster, follower, "sluice_broker_scrub_damaged_batches_total") >= 1,
            "the scrub to find the damage",
            timeout=40,
        )
        moved = f"broker {follower} found damaged batches in its log"
        until(lambda: moved in cluster.coordinator.log(), "the report to reach the controller")
        until(lambda: "re-fetching from the leader" in cluster.brokers[follower].proc.log(), "the re-fetch")
        until(lambda: cluster.segments(follower, "scrub") == good, "the follower healed byte for byte", 40)
        until(lambda: sorted(cluster.partition("scrub").isr) == [0, 1, 2], "the follower back in sync")
        assert _metric(cluster, follower, "sluice_broker_scrub_bytes_total") >= len(good) / 2


def test_without_the_scrub_the_rot_stays_unfound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_BROKER_SCRUB_RATE", "0")
    with cluster_of(tmp_path) as cluster:
        leader, follower = _setup(cluster)
        good = cluster.segments(leader, "scrub")
        _flip_value_bit(cluster.data / f"b{follower}" / "scrub-0")
        time.sleep(5)
        assert cluster.segments(follower, "scrub") != good
        assert "fail their CRC" not in cluster.brokers[follower].proc.log()
