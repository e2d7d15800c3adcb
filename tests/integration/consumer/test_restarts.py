"""Restarts under a running group: the coordinator (assignments and offsets survive, nothing is
reassigned) and Redis killed with -9 (AOF with fsync on every write: no committed offset is lost)."""

from __future__ import annotations

import time
from typing import Any

from sluice.client.consumer import Consumer
from sluice.codec.batch import Record
from tests.integration.consumer.conftest import Cluster

CFG: dict[str, Any] = {
    "auto_offset_reset": "earliest",
    "auto_commit_interval": "100ms",
    "session_timeout": "20s",
    "fetch_max_wait": "100ms",
}


def produce(cluster: Cluster, topic: str, start: int, n: int) -> None:
    with cluster.client().producer(topic, partitioner="round_robin") as p:
        for i in range(start, start + n):
            p.send(b"%d" % i)


def consume(consumers: list[Consumer], total: int, got: list[Record], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while len(got) < total:
        assert time.monotonic() < deadline, f"{len(got)} of {total}"
        for c in consumers:
            got += c.poll(0.05)


def test_coordinator_restart_keeps_assignments_epochs_and_offsets(own_cluster: Cluster) -> None:
    cluster = own_cluster
    topic = cluster.topic(4, "restart")
    lost: list[object] = []
    members = [
        cluster.client().consumer("restart", [topic], on_lost=lost.append, **CFG),
        cluster.client().consumer("restart", [topic], on_lost=lost.append, **CFG),
    ]
    got: list[Record] = []
    deadline = time.monotonic() + 10
    while not all(len(m.assignment()) == 2 for m in members):
        assert time.monotonic() < deadline, [m.assignment() for m in members]
        for m in members:
            got += m.poll(0.05)
    produce(cluster, topic, 0, 200)
    consume(members, 200, got)
    before = [(m.member_id, m.member_epoch, m.assignment()) for m in members]
    for m in members:
        m.poll(0)
        m.commit()
    offsets = cluster.client().admin.group_offsets("restart")

    cluster.restart_coordinator()
    produce(cluster, topic, 200, 200)
    consume(members, 400, got)
    time.sleep(1.0)  # several heartbeats with the new coordinator process
    for m in members:
        m.poll(0.1)
    assert lost == []
    assert [(m.member_id, m.member_epoch, m.assignment()) for m in members] == before
    assert sorted(int(r.value) for r in got) == list(range(400)), "nothing lost, nothing twice"
    after = cluster.client().admin.group_offsets("restart")
    assert all(after[tp] >= offsets[tp] for tp in offsets)
    for m in members:
        m.close()


def test_redis_kill_9_loses_no_committed_offset(own_cluster: Cluster) -> None:
    cluster = own_cluster
    topic = cluster.topic(4, "redis")
    consumer = cluster.client().consumer("redis", [topic], **CFG)
    produce(cluster, topic, 0, 100)
    got: list[Record] = []
    consume([consumer], 100, got)
    consumer.poll(0)
    assert consumer.commit() == {(topic, p): 25 for p in range(4)}
    admin = cluster.client().admin
    assert admin.group_offsets("redis") == {(topic, p): 25 for p in range(4)}

    cluster.kill_restart_redis()
    deadline = time.monotonic() + 20
    while True:
        try:
            offsets = admin.group_offsets("redis")
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert offsets == {(topic, p): 25 for p in range(4)}
    # The group carries on: more records, committed again.
    produce(cluster, topic, 100, 40)
    consume([consumer], 140, got)
    consumer.poll(0)
    deadline = time.monotonic() + 20
    while admin.group_offsets("redis") != {(topic, p): 35 for p in range(4)}:
        assert time.monotonic() < deadline
        consumer.poll(0.1)
        try:
            consumer.commit()
        except Exception:
            time.sleep(0.2)  # Redis still coming back: the commit is retried
    assert sorted(int(r.value) for r in got) == list(range(140))
    consumer.close()
