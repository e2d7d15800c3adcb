"""Changing a replication factor and cancelling a reassignment, with real processes (docs/replication.md,
"Changing the replication factor" and "Cancelling a reassignment"): a coordinator on a private Redis and
three brokers (a fourth for the cancel).

- a factor-1 partition grows to 3 while an acks=all producer writes to it (the new replicas catch up and
  join the ISR; every replica's log is then the leader's byte for byte), then shrinks to 2 (the leader
  stays; the dropped replica's data is deleted); every acknowledged record is consumed exactly once, in
  order, and no produce failed; above the live brokers is refused (INVALID_REPLICATION_FACTOR);
- a throttled move to a new broker, cancelled while the new replica catches up, goes back to the original
  replicas in their order (the leader unchanged), the added replica's data is deleted, and nothing
  acknowledged is lost; cancelling again is refused (nothing in progress); cancelling a factor change
  through the CLI puts the factor back.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sluice.client import Client
from sluice.errors import InvalidArgument, InvalidReplicationFactor, ReassignmentInProgress

from .test_reassignment import Load, alive_brokers, cli, consume_all, describe, segments
from .test_replication import cluster_of, create, until


def test_a_partition_grows_from_1_to_3_replicas_under_load_then_shrinks_to_2(tmp_path: Path) -> None:
    with cluster_of(tmp_path) as cluster:
        until(lambda: len(alive_brokers(cluster)) == 3, "three brokers registered")
        with Client(cluster.coordinator.address) as client:
            client.admin.create_topic("rf", 1, replication_factor=1)
            load = Load(cluster.coordinator.address, "rf", 0)
            until(lambda: len(load.acked) >= 300, "the producer under way", timeout=60)
            with pytest.raises(InvalidReplicationFactor):
                client.admin.alter_topic("rf", replication_factor=4)
            with pytest.raises(InvalidArgument):  # min ISR above the new factor: refused, nothing started
                client.admin.alter_topic("rf", replication_factor=1, min_insync_replicas=2)
            leader = describe(cluster, "rf", 0).broker_id
            # min ISR stays 1 while the new replicas catch up (at 2, acks=all would wait for them).
            info = client.admin.alter_topic("rf", replication_factor=3)
            assert (info.replication_factor, info.min_insync_replicas) == (3, 1)
            state = describe(cluster, "rf", 0)
            assert state.replicas[0] == leader
            assert len(state.replicas) == 3
            assert sorted(state.adding_replicas) == sorted(b for b in state.replicas if b != leader)
            with pytest.raises(ReassignmentInProgress):
                client.admin.alter_topic("rf", replication_factor=2)
            until(lambda: not describe(cluster, "rf", 0).adding_replicas, "the new replicas in sync", 60)
            grown = describe(cluster, "rf", 0)
            assert sorted(grown.isr) == [0, 1, 2]
            assert grown.broker_id == leader
            client.admin.alter_topic("rf", min_insync_replicas=2)
            mark = len(load.acked)
            until(lambda: len(load.acked) >= mark + 300, "acks=all writes at factor 3", timeout=60)

            client.admin.alter_topic("rf", replication_factor=2)
            shrunk = describe(cluster, "rf", 0)
            assert len(shrunk.replicas) == 2
            assert shrunk.broker_id == leader
            assert not shrunk.adding_replicas
            assert not shrunk.removing_replicas
            (dropped,) = {0, 1, 2} - set(shrunk.replicas)
            until(lambda: not (cluster.data / f"b{dropped}" / "rf-0").exists(), "the dropped copy deleted")
            mark = len(load.acked)
            until(lambda: len(load.acked) >= mark + 200, "acks=all writes at factor 2", timeout=60)
        load.stop()
        assert not load.errors, load.errors[:3]
        got = consume_all(cluster.coordinator.address, "rf", 0, len(load.acked))
        assert got == load.acked, f"{len(load.acked)} acknowledged, {len(got)} consumed (not once, in order)"
        until(
            lambda: all(
                segments(cluster, b, "rf", 0) == segments(cluster, leader, "rf", 0) for b in shrunk.replicas
            ),
            "the replicas to match the leader",
        )


def test_a_cancelled_move_goes_back_to_the_original_replicas(tmp_path: Path) -> None:
    with cluster_of(tmp_path) as cluster:
        create(cluster, "cx")
        with Client(cluster.coordinator.address) as client, client.producer("cx") as producer:
            for f in [producer.send(bytes(4000), partition=0) for _ in range(400)]:
                f.result(timeout=30)
        cluster.start_broker(3)
        until(lambda: 3 in alive_brokers(cluster), "broker 3 registered")
        before = describe(cluster, "cx", 0)
        load = Load(cluster.coordinator.address, "cx", 0)
        until(lambda: len(load.acked) >= 200, "the producer under way", timeout=60)
        target = [3, *before.replicas[1:]]  # the preferred leader leaves: the order must come back too
        with Client(cluster.coordinator.address) as client:
            # 1.6 MB at 100 KB/s: at least 15 s before broker 3 could be in sync.
            client.admin.reassign_partitions({("cx", 0): target}, throttle_bytes_per_second=100_000)
            until((cluster.data / "b3" / "cx-0").exists, "broker 3 catching up")
            time.sleep(1)
            assert list(describe(cluster, "cx", 0).adding_replicas) == [3]
            out = cli(cluster, "topic", "reassign", "--cancel", "cx", "-f", "json")
            assert json.loads(out) == {"cancelled": [{"topic": "cx", "partition": 0}]}
            after = describe(cluster, "cx", 0)
            assert list(after.replicas) == list(before.replicas)
            assert not after.adding_replicas
            assert not after.removing_replicas
            assert after.broker_id == before.broker_id
            assert after.leader_epoch == before.leader_epoch
            until(lambda: not (cluster.data / "b3" / "cx-0").exists(), "the added copy deleted")
            with pytest.raises(InvalidArgument):
                client.admin.cancel_reassignments([("cx", 0)])
            mark = len(load.acked)
            until(lambda: len(load.acked) >= mark + 200, "writes after the cancel", timeout=60)
            load.stop()
            assert not load.errors, load.errors[:3]

            # A factor change cancelled everywhere: the topic's factor is the old one again.
            client.admin.alter_topic("cx", replication_factor=4, throttle_bytes_per_second=100_000)
            assert "Cancelled 1 reassignment(s): cx/0" in cli(cluster, "topic", "reassign", "--cancel")
            info = client.admin.describe_topic("cx")
            assert info.replication_factor == 3
            assert list(info.partitions[0].replicas) == list(before.replicas)
        got = consume_all(cluster.coordinator.address, "cx", 0, 400 + len(load.acked))
        assert got[400:] == load.acked
        assert len(got) == 400 + len(load.acked)
