"""Controlled shutdown and preferred leaders with real processes (docs/replication.md, "Controlled
shutdown", "Preferred leaders"): a coordinator on a private Redis, three brokers, factor 3, min ISR 2.

- SIGTERM to a leader: before it exits, the controller has moved its leadership to an in-sync follower
  (next leader epoch) and taken it out of the ISR; it logs that it led 0 partitions; acks=all writes go on
  with the two others, and nothing acknowledged is missing on the new leader;
- when it returns and rejoins the ISR, the automatic rebalance gives the preferred replica its leadership
  back; with the rebalance off, ``ElectLeaders`` (the admin RPC) does it on demand;
- a whole cluster stopped broker by broker: the last broker, whose partitions nobody can take, stops at
  once; without a controller at all, a broker stops after two unanswered asks.
"""

from __future__ import annotations

import signal
import time
import urllib.request
from pathlib import Path

from sluice.client import Client
from sluice.v1 import common_pb2
from sluice.v1 import coordinator_pb2 as cpb

from .conftest import make_batch, part, vals
from .test_replication import Cluster, cluster_of, create, high_watermark, isr, until


def _sigterm_leader(cluster: Cluster, topic: str) -> tuple[int, float]:
    """SIGTERM the partition's leader and wait for it to exit; (its id, seconds from the signal until
    the metadata names another leader)."""
    old_id = cluster.partition(topic).broker_id
    old = cluster.brokers[old_id]
    started = time.monotonic()
    old.proc.process.send_signal(signal.SIGTERM)
    moved = None
    deadline = started + 40
    while old.alive() and time.monotonic() < deadline:
        if moved is None and cluster.partition(topic).broker_id not in (old_id, -1):
            moved = time.monotonic() - started
        time.sleep(0.02)
    assert not old.alive(), "the broker did not stop"
    assert moved is not None, "the leadership moved only after the broker exited"
    old.close()
    old.reap()
    return old_id, moved


def _metric(cluster: Cluster, line: bytes) -> bool:
    return line in urllib.request.urlopen(f"http://{cluster.coordinator.metrics}/metrics", timeout=5).read()


def test_sigterm_moves_leadership_before_the_broker_exits_and_it_comes_back(tmp_path: Path) -> None:
    with cluster_of(tmp_path, session="10s") as cluster:
        create(cluster, "cs")
        state = cluster.partition("cs")
        leader = cluster.brokers[state.broker_id]
        for i in range(10):
            answer = leader.produce("cs", 0, make_batch(vals(3, prefix=f"a{i}-")), acks=-1)
            assert answer.error.code == common_pb2.NONE, answer.error.message
        old_id, moved_after = _sigterm_leader(cluster, "cs")
        assert "controlled shutdown done" in cluster.brokers[old_id].proc.log()
        assert "leading 0 partitions" in cluster.brokers[old_id].proc.log()
        now = cluster.partition("cs")
        assert now.leader_epoch == state.leader_epoch + 1
        assert old_id not in now.isr
        assert len(now.isr) == 2
        # Well inside the session timeout (10 s): the move did not wait for an expiry.
        assert moved_after < 5
        new_leader = cluster.brokers[now.broker_id]
        until(lambda: high_watermark(new_leader, "cs") == 30, "the new leader's HW over every acked record")
        answer = new_leader.produce("cs", 0, make_batch(vals(3, prefix="b")), acks=-1)
        assert answer.error.code == common_pb2.NONE, answer.error.message
        assert _metric(cluster, b'sluice_coordinator_leader_elections_total{kind="controlled"} 1.0')
        # Back: it catches up, rejoins the ISR and, preferred, leads again (the automatic rebalance).
        cluster.start_broker(old_id)
        until(lambda: isr(cluster, "cs") == [0, 1, 2], "the ISR to hold every replica again", timeout=30)
        until(lambda: cluster.partition("cs").broker_id == old_id, "the preferred leader back", timeout=30)
        back = cluster.brokers[old_id]
        # A new leader's HW starts at its checkpoint and moves once the ISR fetched from it.
        until(lambda: high_watermark(back, "cs") == 33, "the preferred leader's HW over every acked record")
        fetched = back.fetch(part("cs", 0), max_bytes=1 << 20).partitions[0]
        assert fetched.error.code == common_pb2.NONE
        assert fetched.next_offset == 33
        assert _metric(cluster, b'sluice_coordinator_leader_elections_total{kind="preferred"} 1.0')


def test_elect_leaders_on_demand_when_the_rebalance_is_off(tmp_path: Path) -> None:
    no_rebalance = ("--auto-leader-rebalance", "false")
    with cluster_of(tmp_path, session="10s", coordinator_args=no_rebalance) as cluster:
        create(cluster, "el")
        preferred = cluster.partition("el").replicas[0]
        old_id, _ = _sigterm_leader(cluster, "el")
        assert old_id == preferred
        cluster.start_broker(old_id)
        until(lambda: isr(cluster, "el") == [0, 1, 2], "the ISR to hold every replica again", timeout=30)
        time.sleep(1.0)  # a rebalance, were it on, would have run by now (it is woken by the ISR change)
        assert cluster.partition("el").broker_id != preferred
        with Client(cluster.coordinator.address) as client:
            elected = client.admin.elect_leaders(["el"])
        assert elected == [("el", 0, preferred)]
        assert cluster.partition("el").broker_id == preferred
        answer = cluster.brokers[preferred].produce("el", 0, make_batch(vals(2)), acks=-1)
        assert answer.error.code == common_pb2.NONE, answer.error.message
        with Client(cluster.coordinator.address) as client:
            assert client.admin.elect_leaders([]) == []  # balanced: nothing moves
        stub = cluster.stub
        assert stub.ElectLeaders(cpb.ElectLeadersRequest(), timeout=10).elected == []
        # The whole cluster stops, one broker after the other: each hands its leadership on, and the
        # last one, with every other replica stopping, stops at once instead of asking for 30 s.
        order = [b for b in range(3) if b != preferred] + [preferred]
        for b in order:
            started = time.monotonic()
            assert cluster.brokers[b].stop() == 0
            assert time.monotonic() - started < 10
        last = cluster.brokers[preferred].proc.log()
        assert "controlled shutdown gave up" in last
        assert "(1 ask(s))" in last


def test_without_a_controller_the_broker_stops_after_two_unanswered_asks(tmp_path: Path) -> None:
    with cluster_of(tmp_path, session="10s") as cluster:
        create(cluster, "gone")
        leader_id = cluster.partition("gone").broker_id
        cluster.coordinator.kill()
        started = time.monotonic()
        assert cluster.brokers[leader_id].stop() == 0
        assert time.monotonic() - started < 10  # not the 30 s timeout
        log = cluster.brokers[leader_id].proc.log()
        assert "controlled shutdown gave up" in log
        assert "(2 ask(s)): still leading 1 partitions" in log
