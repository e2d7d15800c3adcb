"""Seed 004 (RocketMQ), exactly: one group, consumer 1 subscribes tagA, consumer 2 tagB, then 8 tagB
messages on a 4-partition topic (two per partition, round robin, as RocketMQ's producer spreads them).

RocketMQ lost 4 of the 8 (the group kept one subscription row, overwritten by the last heartbeat) and its
dashboard called all 8 CONSUMED. Here: with ``reject`` consumer 2 is refused loudly; with ``split`` each
filter has its own offset track, consumer 2 receives all 8 and consumer 1 none; and ``sluice track``
reports what really happened to each message, from the committed offsets and the real records.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from sluice.client.consumer import Consumer
from sluice.codec.batch import Record
from sluice.errors import InconsistentSubscription
from tests.harness import ROOT, SERVICES
from tests.integration.consumer.conftest import Cluster

FAST: dict[str, Any] = {
    "auto_offset_reset": "earliest",
    "auto_commit_interval": "100ms",
    "fetch_max_wait": "100ms",
}


def sluice(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SERVICES), "SLUICE_BOOTSTRAP": cluster.bootstrap}
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )


def track(cluster: Cluster, topic: str, partition: int, offset: int, group: str) -> dict[str, str]:
    """{track filter: state} from the real CLI."""
    out = sluice(cluster, "track", topic, str(partition), str(offset), "--group", group, "--format", "json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    return {t["filter"] or "-": t["state"] for t in doc["tracks"]}


def send_tag_b(cluster: Cluster, topic: str, n: int = 8, start: int = 0) -> list[tuple[int, int]]:
    with cluster.client().producer(topic, partitioner="round_robin") as p:
        futures = [p.send(f"B{i}".encode(), tag="tagB") for i in range(start, start + n)]
    return [(f.result().partition, f.result().offset) for f in futures]


def drain(consumers: list[Consumer], until: Callable[[], bool], timeout: float = 10) -> list[list[Record]]:
    got: list[list[Record]] = [[] for _ in consumers]
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, [len(g) for g in got]
        for i, c in enumerate(consumers):
            got[i] += c.poll(0.05)
    return got


def committed(cluster: Cluster, group: str, track_name: str = "default") -> dict[int, int]:
    return {p: o for (_, p), o in cluster.client().admin.group_offsets(group, track=track_name).items()}


def test_reject_refuses_the_second_filter_and_track_tells_the_truth(cluster: Cluster) -> None:
    topic = cluster.topic(4, "seed004r")
    group = "seed004-reject"
    c1 = cluster.client().consumer(group, {topic: "tagA"}, **FAST)
    with pytest.raises(InconsistentSubscription) as refused:
        cluster.client().consumer(group, {topic: "tagB"}, **FAST)
    message = str(refused.value)
    for needle in (topic, "'tagA'", "'tagB'", c1.member_id):
        assert needle in message, message

    sent = send_tag_b(cluster, topic)
    assert sorted(sent) == [(p, o) for p in range(4) for o in range(2)]
    # Consumer 1 receives none of them, yet its filtered fetches move its committed offsets past them.
    got = drain([c1], lambda: committed(cluster, group) == dict.fromkeys(range(4), 2))
    assert got == [[]]
    described = sluice(cluster, "group", "describe", group)
    assert described.returncode == 0, described.stderr
    assert "INCONSISTENT" in described.stdout or "inconsistent subscription" in described.stdout
    for p, o in sent:
        # RocketMQ's dashboard said CONSUMED; nobody processed them: the tagA track skipped them.
        assert track(cluster, topic, p, o, group) == {"tagA": "CONSUMED_BUT_FILTERED"}
    c1.close()
    for p, o in sent:
        # Nobody reads the topic now, but the binding stays: the position a tagA member returning would
        # resume is past them, and track still says so.
        assert track(cluster, topic, p, o, group) == {"tagA": "CONSUMED_BUT_FILTERED"}


def split_group(cluster: Cluster, name: str) -> tuple[str, str, Consumer, Consumer]:
    """A split group with consumer 1 (tagA) and consumer 2 (tagB) joined, each owning all 4 partitions."""
    topic = cluster.topic(4, name)
    configured = sluice(cluster, "group", "config", name, "--conflict-policy", "split")
    assert configured.returncode == 0, configured.stderr
    assert "conflict_policy=split" in configured.stdout
    c1 = cluster.client().consumer(name, {topic: "tagA"}, **FAST)
    c2 = cluster.client().consumer(name, {topic: "tagB"}, **FAST)
    drain([c1, c2], lambda: len(c1.assignment()) == 4 and len(c2.assignment()) == 4)
    tracks = {next(iter(c.tracks().values())) for c in (c1, c2)}
    assert "default" in tracks
    assert len(tracks) == 2
    return topic, name, c1, c2


def test_split_delivers_every_tag_b_message_to_consumer_2_and_none_to_consumer_1(cluster: Cluster) -> None:
    topic, group, c1, c2 = split_group(cluster, "seed004-split")
    send_tag_b(cluster, topic)
    got: list[list[Record]] = [[], []]
    deadline = time.monotonic() + 10
    while len(got[1]) < 8:
        assert time.monotonic() < deadline, [len(g) for g in got]
        got[0] += c1.poll(0.05)
        got[1] += c2.poll(0.05)
    for _ in range(5):  # anything more would show up now
        got[0] += c1.poll(0.05)
        got[1] += c2.poll(0.05)
    assert got[0] == []
    assert sorted(r.value for r in got[1]) == [f"B{i}".encode() for i in range(8)]
    described = sluice(cluster, "group", "describe", group)
    assert described.returncode == 0, described.stderr
    assert "split into tracks" in described.stdout
    c1.close()
    c2.close()


def test_split_track_reports_each_message_per_track(cluster: Cluster) -> None:
    topic, group, c1, c2 = split_group(cluster, "seed004-track")
    tag_b_track = next(iter(c2.tracks().values()))
    sent = send_tag_b(cluster, topic)
    drain([c1, c2], lambda: committed(cluster, group, tag_b_track) == dict.fromkeys(range(4), 2), timeout=5)
    drain([c1, c2], lambda: committed(cluster, group) == dict.fromkeys(range(4), 2))
    for p, o in sent:
        assert track(cluster, topic, p, o, group) == {"tagA": "CONSUMED_BUT_FILTERED", "tagB": "CONSUMED"}

    # A ninth message that consumer 2 has not processed yet (it paused partition 0).
    c2.pause([(topic, 0)])
    with cluster.client().producer(topic) as producer:
        ninth = producer.send(b"B8", tag="tagB", partition=0).result()
    drain([c1, c2], lambda: committed(cluster, group).get(0) == 3)
    assert track(cluster, topic, 0, ninth.offset, group) == {
        "tagA": "CONSUMED_BUT_FILTERED",
        "tagB": "NOT_CONSUME_YET",
    }
    c1.close()
    c2.close()


def test_reject_hands_the_position_to_the_next_filter_and_track_names_what_it_skipped(
    cluster: Cluster,
) -> None:
    """Under ``reject`` a topic has one position: a tagB member joining once the tagA member left inherits
    it, so the tagB records tagA's filtered fetches moved past never reach it. That is the documented rule;
    what must not happen is that nobody can tell: describe records the handover, and ``sluice track``
    says SKIPPED_AT_HANDOVER for exactly those records."""
    topic = cluster.topic(4, "seed004h")
    group = "seed004-handover"
    c1 = cluster.client().consumer(group, {topic: "tagA"}, **FAST)
    skipped = send_tag_b(cluster, topic)
    drain([c1], lambda: committed(cluster, group) == dict.fromkeys(range(4), 2))
    c1.close()
    c2 = cluster.client().consumer(group, {topic: "tagB"}, **FAST)
    later = send_tag_b(cluster, topic, 4, start=8)
    got = drain([c2], lambda: committed(cluster, group) == dict.fromkeys(range(4), 3))
    assert sorted(r.value for r in got[0]) == sorted(f"B{i}".encode() for i in range(8, 12))
    [binding] = [t for t in cluster.client().admin.describe_group(group).tracks if t.topic == topic]
    assert (binding.filter, binding.track, binding.inherited_filter) == ("tagB", "default", "tagA")
    assert binding.handover_offsets == dict.fromkeys(range(4), 2)
    described = sluice(cluster, "group", "describe", group)
    assert "took over track default from filter 'tagA'" in described.stdout
    for p, o in skipped:
        assert track(cluster, topic, p, o, group) == {"tagB": "SKIPPED_AT_HANDOVER"}
    for p, o in later:
        assert track(cluster, topic, p, o, group) == {"tagB": "CONSUMED"}
    c2.close()
