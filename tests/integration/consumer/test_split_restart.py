"""Must show, split: a tagB member that stops and restarts receives every tagB record produced while it
was away, exactly once, also when the coordinator is killed (-9) and started again meanwhile.

Real processes: the coordinator, broker, offset store and Redis of ``own_cluster``, and two members
(``member_process.py``) in one group with ``--conflict-policy split``: ``tagA`` on the default track,
``tagB`` on its own. While tagB is away the tagA member's filtered fetches move the default track past
every tagB record: before tracks were kept by filter, the tagB track was deleted with its last member and
the restarted member was handed the default's position, silently skipping all of them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sluice import Client
from tests.harness import ROOT, restart, start_service
from tests.integration.consumer.conftest import Cluster
from tests.integration.consumer.test_seed_004 import sluice

SCRIPT = Path(__file__).with_name("member_process.py")
PARTITIONS = 4
AWAY = 1_000  # records of each tag produced while the tagB member is away
WARM_UP = 20


class Member:
    """``member_process.py`` reading the topic with one filter; what it processed, from its output."""

    def __init__(self, cluster: Cluster, group: str, topic: str, topic_filter: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), cluster.bootstrap, group, topic, "3s", topic_filter],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.member_id = ""
        self.records: list[tuple[int, int, str]] = []  # (partition, offset, tag)
        self.joined = threading.Event()
        self.closed = threading.Event()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                parts = line.split()
                if not line.endswith("\n") or not parts:
                    break
                if parts[0] == "JOINED":
                    self.member_id = parts[1]
                    self.joined.set()
                elif parts[0] == "R":
                    self.records.append((int(parts[1]), int(parts[2]), parts[4]))
                elif parts[0] == "CLOSED":
                    self.closed.set()

    def stop(self) -> None:
        """SIGTERM: the member commits what it processed and leaves the group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def wait_for(what: str, done: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def produce(client: Client, topic: str, count: int, start: int) -> list[tuple[int, int, str]]:
    """``count`` records of each tag, interleaved over every partition; their (partition, offset, tag)."""
    with client.producer(topic, partitioner="round_robin") as p:
        futures = [
            (p.send(f"{tag}-{i}".encode(), tag=tag), tag)
            for i in range(start, start + count)
            for tag in ("tagA", "tagB")
        ]
    return [(f.result().partition, f.result().offset, tag) for f, tag in futures]


def track_of(client: Client, group: str, topic: str, topic_filter: str) -> str:
    [b] = [
        b for b in client.admin.describe_group(group).tracks if (b.topic, b.filter) == (topic, topic_filter)
    ]
    return b.track


def committed(client: Client, group: str, track: str) -> dict[int, int]:
    return {p: o for (_, p), o in client.admin.group_offsets(group, track=track).items()}


@pytest.mark.parametrize("coordinator_restart", [False, True], ids=["steady", "coordinator-kill-9"])
def test_a_returning_tag_b_member_receives_every_tag_b_record_exactly_once(
    own_cluster: Cluster, coordinator_restart: bool
) -> None:
    cluster = own_cluster
    admin = cluster.client()
    group = f"split-restart-{int(coordinator_restart)}"
    topic = cluster.topic(PARTITIONS, "split")
    admin.admin.set_group_config(group, conflict_policy="split")
    members: list[Member] = []
    try:
        a = Member(cluster, group, topic, "tagA")
        members.append(a)
        assert a.joined.wait(20)  # first, so tagA holds the default track and tagB gets its own
        b = Member(cluster, group, topic, "tagB")
        members.append(b)
        assert b.joined.wait(20)
        warm = produce(admin, topic, WARM_UP, 0)
        wait_for("the tagB member's warm-up records", lambda: len(b.records) >= WARM_UP)
        tag_b_track = track_of(admin, group, topic, "tagB")
        assert tag_b_track != "default"
        b.stop()
        assert b.closed.is_set()
        before = committed(admin, group, tag_b_track)
        ends = {p: 1 + max(o for q, o, _ in warm if q == p) for p in range(PARTITIONS)}
        assert before == ends  # it committed everything it processed on leaving

        sent = produce(admin, topic, AWAY // 2, WARM_UP)
        if coordinator_restart:
            cluster.coordinator.kill()
            cluster.coordinator = restart(cluster.coordinator)
        sent += produce(admin, topic, AWAY - AWAY // 2, WARM_UP + AWAY // 2)
        ends = {p: 1 + max(o for q, o, _ in warm + sent if q == p) for p in range(PARTITIONS)}
        # The precondition of the old loss: the tagA member's filtered fetches took the default track
        # past every tagB record produced meanwhile.
        wait_for(
            "the default track past every record", lambda: committed(admin, group, "default") == ends, 30
        )
        assert committed(admin, group, tag_b_track) == before  # kept while nobody reads it
        assert track_of(admin, group, topic, "tagB") == tag_b_track
        described = sluice(cluster, "group", "describe", group, "--format", "json")
        assert described.returncode == 0, described.stderr
        [idle] = [t for t in json.loads(described.stdout)["tracks"] if t["filter"] == "tagB"]
        assert (idle["track"], idle["members"], idle["source_track"]) == (tag_b_track, 0, "default")
        assert idle["idle_since_ms"] > 0

        back = Member(cluster, group, topic, "tagB")
        members.append(back)
        assert back.joined.wait(20)
        expected = Counter((p, o) for p, o, tag in sent if tag == "tagB")
        wait_for("every tagB record", lambda: len(back.records) >= len(expected), 30)
        wait_for("the tagB track's commits", lambda: committed(admin, group, tag_b_track) == ends, 10)
        got = Counter((p, o) for p, o, _ in back.records)
        lost = expected - got
        duplicated = {k: n for k, n in got.items() if n > 1}
        assert not lost, f"{len(lost)} tagB records lost, e.g. {sorted(lost)[:5]}"
        assert not duplicated, (
            f"{len(duplicated)} tagB records delivered twice, e.g. {sorted(duplicated)[:5]}"
        )
        assert set(got) == set(expected)  # nothing else: no tagA record, no warm-up record again
        assert {tag for _, _, tag in back.records} == {"tagB"}
        tagged = {(p, o) for p, o, tag in sent if tag == "tagA"}
        assert tagged <= {(p, o) for p, o, _ in a.records}  # and the tagA member had all of its own
    finally:
        for m in members:
            m.kill()


def test_an_idle_filter_s_offsets_expire_after_a_shortened_retention(own_cluster: Cluster) -> None:
    """``--group-offsets-retention`` on a real coordinator: kept while within it, gone after it."""
    cluster = own_cluster
    topic = cluster.topic(PARTITIONS, "retention")
    cluster.coordinator.terminate()
    cluster.coordinator = start_service(
        "coordinator", *cluster.coordinator.args, "--group-offsets-retention", "2s"
    )
    admin = cluster.client()
    wait_for("the broker back", lambda: any(b.alive for b in admin.metadata(refresh=True).brokers.values()))
    group = "split-retention"
    admin.admin.set_group_config(group, conflict_policy="split")
    fast: dict[str, Any] = {
        "auto_offset_reset": "earliest",
        "auto_commit_interval": "100ms",
        "fetch_max_wait": "100ms",
    }
    a = cluster.client().consumer(group, {topic: "tagA"}, **fast)
    b = cluster.client().consumer(group, {topic: "tagB"}, **fast)
    produce(admin, topic, 4, 0)
    got: list[object] = []
    deadline = time.monotonic() + 20
    while len(got) < 4:
        assert time.monotonic() < deadline, got
        a.poll(0.05)
        got += b.poll(0.05)
    tag_b_track = track_of(admin, group, topic, "tagB")
    b.close()  # commits, leaves: the binding goes idle
    assert committed(admin, group, tag_b_track) == dict.fromkeys(range(PARTITIONS), 2)
    idle_since = time.monotonic()
    [binding] = [t for t in admin.admin.describe_group(group).tracks if t.filter == "tagB"]
    assert binding.members == 0
    assert binding.idle_since_ms > 0

    def expired() -> bool:
        a.poll(0.05)  # tagA stays: only the idle filter expires
        return not [t for t in admin.admin.describe_group(group).tracks if t.filter == "tagB"]

    wait_for("the tagB binding to expire", expired, 15)
    assert time.monotonic() - idle_since >= 1.5  # not before the retention
    assert committed(admin, group, tag_b_track) == {}
    assert committed(admin, group, "default") == dict.fromkeys(range(PARTITIONS), 2)
    a.close()
