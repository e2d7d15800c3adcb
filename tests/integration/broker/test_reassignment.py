"""Partition reassignment with real processes (docs/replication.md, "Reassignment"): a coordinator on a
private Redis, three brokers, then a fourth added.

- must-show 6: the partition led by broker 0 moves from broker 0 to the new broker 3 while a producer
  (acks=all, idempotent) writes to it: leadership moves off broker 0 with a leader-epoch bump, the new
  replica holds the leader's log byte for byte, broker 0's partition directory is gone, and a consumer
  reading the topic from the start sees every acknowledged record exactly once;
- the refusals are typed: a partition being reassigned already, a target of another size, a dead broker;
- a throttled move (through the CLI, `--status` and `topic describe` showing it) takes no less time than
  the throttle allows;
- the user flows: a broker added and `--rebalance` onto it, then `--drain` of another;
- an unreplicated (factor 1) partition moves the same way.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from sluice.client import Client
from sluice.errors import (
    BrokerNotAvailable,
    InvalidReplicationFactor,
    ReassignmentInProgress,
    SluiceError,
)
from sluice.v1 import coordinator_pb2 as cpb

from .test_replication import Cluster, cluster_of, create, until


def describe(cluster: Cluster, topic: str, partition: int) -> cpb.PartitionDescription:
    meta = cluster.stub.Metadata(cpb.MetadataRequest(topics=[topic]), timeout=10)
    return meta.topics[0].partitions[partition]


def segments(cluster: Cluster, broker_id: int, topic: str, partition: int) -> bytes:
    directory = cluster.data / f"b{broker_id}" / f"{topic}-{partition}"
    return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))


def alive_brokers(cluster: Cluster) -> set[int]:
    meta = cluster.stub.Metadata(cpb.MetadataRequest(), timeout=10)
    return {b.broker_id for b in meta.brokers if b.alive}


class Load:
    """A producer thread at a steady rate (acks=all, idempotent: the SDK's defaults) on one partition,
    keeping the values it had acknowledged."""

    def __init__(self, address: str, topic: str, partition: int) -> None:
        self.acked: list[bytes] = []
        self.errors: list[SluiceError] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(address, topic, partition), daemon=True)
        self._thread.start()

    def _run(self, address: str, topic: str, partition: int) -> None:
        with Client(address) as client, client.producer(topic, linger="2ms") as producer:
            i = 0
            while not self._stop.is_set() and i < 200_000:
                batch = [b"r%06d" % (i + j) for j in range(20)]
                futures = [producer.send(v, partition=partition) for v in batch]
                for value, future in zip(batch, futures, strict=True):
                    try:
                        future.result(timeout=30)
                        self.acked.append(value)
                    except SluiceError as exc:
                        self.errors.append(exc)
                i += len(batch)
                time.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()


def consume_all(address: str, topic: str, partition: int, expected: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    with Client(address) as client, client.fetcher({(topic, partition): 0}, max_wait_ms=200) as fetcher:
        while len(got) < expected and time.monotonic() < deadline:
            got += [r.value for r in fetcher.fetch(timeout=5)]
        # Anything more would be a duplicate: one more poll must bring nothing.
        got += [r.value for r in fetcher.fetch(timeout=1)]
    return got


def test_a_partition_moves_from_broker_0_to_a_new_broker_3_under_load(tmp_path: Path) -> None:
    with cluster_of(tmp_path) as cluster:
        with Client(cluster.coordinator.address) as client:
            until(lambda: len(alive_brokers(cluster)) == 3, "three brokers registered")
            client.admin.create_topic("mv", 3, replication_factor=3, min_insync_replicas=2)
        cluster.start_broker(3)
        until(lambda: 3 in alive_brokers(cluster), "broker 3 registered")
        # Factor 3 on three brokers: every partition has a replica on broker 0; take the one it leads,
        # so leadership has to move too.
        meta = cluster.stub.Metadata(cpb.MetadataRequest(topics=["mv"]), timeout=10)
        before = next(p for p in meta.topics[0].partitions if p.broker_id == 0)
        partition = before.partition
        target = [3, *(b for b in before.replicas if b != 0)]

        load = Load(cluster.coordinator.address, "mv", partition)
        until(lambda: len(load.acked) >= 500, "the producer under way", timeout=60)
        with Client(cluster.coordinator.address) as client:
            started = client.admin.reassign_partitions(
                {("mv", partition): target}, throttle_bytes_per_second=0
            )
            state = started[0].partitions[partition]
            assert (state.adding_replicas, state.removing_replicas) == ((3,), (0,))
            assert set(state.replicas) == {0, 1, 2, 3}
            with pytest.raises(ReassignmentInProgress):
                client.admin.reassign_partitions({("mv", partition): target})

            until(
                lambda: not describe(cluster, "mv", partition).removing_replicas,
                "the reassignment to complete",
                timeout=60,
            )
            until(lambda: len(load.acked) >= 500 + 1000, "more records after the switch", timeout=60)
        load.stop()

        after = describe(cluster, "mv", partition)
        assert list(after.replicas) == target
        assert after.broker_id in target
        assert after.broker_id != 0
        assert after.leader_epoch == before.leader_epoch + 1
        assert sorted(after.isr) == sorted(target)
        # Broker 0 was told to remove its replica: the partition's directory is gone.
        until(lambda: not (cluster.data / "b0" / f"mv-{partition}").exists(), "broker 0's data deleted")
        assert not load.errors, load.errors[:3]

        acked = load.acked
        got = consume_all(cluster.coordinator.address, "mv", partition, len(acked))
        assert len(got) == len(set(got)), "a record was consumed twice"
        assert set(acked) <= set(got), f"{len(set(acked) - set(got))} acknowledged records lost"
        # Every replica, the new one included, holds the leader's log byte for byte.
        until(
            lambda: all(
                segments(cluster, b, "mv", partition) == segments(cluster, after.broker_id, "mv", partition)
                for b in target
            ),
            "the replicas to match the leader",
        )


def test_reassignment_refusals_are_typed(tmp_path: Path) -> None:
    with cluster_of(tmp_path) as cluster:
        create(cluster, "bad")
        with Client(cluster.coordinator.address) as client:
            with pytest.raises(InvalidReplicationFactor):
                client.admin.reassign_partitions({("bad", 0): [0, 1]})
            with pytest.raises(BrokerNotAvailable):
                client.admin.reassign_partitions({("bad", 0): [0, 1, 7]})
            # A reorder moves no data: it completes at once, the preferred leader first.
            current = list(describe(cluster, "bad", 0).replicas)
            reordered = [*current[1:], current[0]]
            client.admin.reassign_partitions({("bad", 0): reordered})
            state = describe(cluster, "bad", 0)
            assert list(state.replicas) == reordered
            assert not state.adding_replicas
            assert not state.removing_replicas


def cli(cluster: Cluster, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "sluice", "--bootstrap", cluster.coordinator.address, *args],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def test_a_throttled_move_catches_up_no_faster_than_the_throttle(tmp_path: Path) -> None:
    """2.4 MB of backlog, a 200 KB/s throttle with one second of burst: the new replica cannot be in sync
    before (2.4 MB - 200 KB) / 200 KB/s = 11 s (unthrottled, the whole test body takes about 3 s, most of
    it the CLI's start-ups). A lower bound only: a loaded machine makes it slower, never faster. Started,
    followed and finished through the CLI."""
    with cluster_of(tmp_path) as cluster:
        create(cluster, "slow")
        with Client(cluster.coordinator.address) as client, client.producer("slow") as producer:
            payload = bytes(4000)
            futures = [producer.send(payload, partition=0) for _ in range(600)]
            for f in futures:
                f.result(timeout=30)
        cluster.start_broker(3)
        until(lambda: 3 in alive_brokers(cluster), "broker 3 registered")
        before = describe(cluster, "slow", 0)
        target = ",".join(map(str, [*before.replicas[:2], 3]))
        rate = 200_000
        began = time.monotonic()
        out = cli(
            cluster, "topic", "reassign", "slow", "-p", "0", "--replicas", target, "--throttle", str(rate)
        )
        assert "Started 1 reassignment(s)" in out
        status = json.loads(cli(cluster, "topic", "reassign", "--status", "-f", "json"))
        (row,) = status["in_progress"]
        assert (row["adding"], row["throttle_bytes_per_second"]) == ([3], rate)
        described = json.loads(cli(cluster, "topic", "describe", "slow", "-f", "json"))
        assert described["partitions"][0]["adding_replicas"] == [3]
        until(lambda: not describe(cluster, "slow", 0).adding_replicas, "the move to complete", timeout=60)
        took = time.monotonic() - began
        assert took >= (2_400_000 - rate) / rate * 0.9, f"caught up in {took:.2f}s despite the throttle"
        assert "No reassignment in progress." in cli(cluster, "topic", "reassign", "--status")
        final = json.loads(cli(cluster, "topic", "describe", "slow", "-f", "json"))["partitions"][0]
        assert final["replicas"] == [int(b) for b in target.split(",")]
        assert final["high_watermark"] == final["log_end_offset"] == 600


def placement(cluster: Cluster, topic: str) -> list[list[int]]:
    meta = cluster.stub.Metadata(cpb.MetadataRequest(topics=[topic]), timeout=10)
    return [list(p.replicas) for p in meta.topics[0].partitions]


def settled(cluster: Cluster) -> bool:
    meta = cluster.stub.Metadata(cpb.MetadataRequest(), timeout=10)
    return not any(p.adding_replicas or p.removing_replicas for t in meta.topics for p in t.partitions)


def test_add_a_broker_and_rebalance_onto_it_then_drain_one(tmp_path: Path) -> None:
    """The user flows, through the CLI: a fourth broker joins and `--rebalance` gives it its share of
    replicas and preferred leaders; then `--drain 0` empties broker 0 (its partition directories go)
    while every record stays readable."""
    with cluster_of(tmp_path) as cluster:
        until(lambda: len(alive_brokers(cluster)) == 3, "three brokers registered")
        with Client(cluster.coordinator.address) as client:
            client.admin.create_topic("grow", 4, replication_factor=2, min_insync_replicas=1)
            with client.producer("grow") as producer:
                for f in [producer.send(b"g%03d" % i, partition=i % 4) for i in range(200)]:
                    f.result(timeout=30)
        cluster.start_broker(3)
        until(lambda: 3 in alive_brokers(cluster), "broker 3 registered")
        plan = json.loads(cli(cluster, "topic", "reassign", "--rebalance", "--dry-run"))
        assert plan["partitions"], "a new empty broker must get replicas"
        cli(cluster, "topic", "reassign", "--rebalance")
        until(lambda: settled(cluster), "the rebalance to complete", timeout=60)
        load = Counter(b for replicas in placement(cluster, "grow") for b in replicas)
        assert load == {0: 2, 1: 2, 2: 2, 3: 2}  # 8 replicas over 4 brokers
        leaders = Counter(replicas[0] for replicas in placement(cluster, "grow"))
        assert max(leaders.values()) == 1  # one preferred leader each
        assert "nothing to move" in cli_err(cluster, "topic", "reassign", "--rebalance")

        cli(cluster, "topic", "reassign", "--drain", "0")
        until(lambda: settled(cluster), "the drain to complete", timeout=60)
        assert all(0 not in replicas for replicas in placement(cluster, "grow"))
        until(
            lambda: not list((cluster.data / "b0").glob("grow-*")),
            "broker 0's directories deleted",
            timeout=60,
        )
        for p in range(4):
            got = consume_all(cluster.coordinator.address, "grow", p, 50)
            assert sorted(got) == [b"g%03d" % i for i in range(p, 200, 4)]


def cli_err(cluster: Cluster, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "sluice", "--bootstrap", cluster.coordinator.address, *args],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    return result.stderr.decode()


def test_an_unreplicated_partition_moves_too(tmp_path: Path) -> None:
    """Factor 1 (every `sluice up` topic by default): the partition is replicated to the new broker for
    the move only, then served there alone, with every record, and deleted from the old one."""
    with cluster_of(tmp_path) as cluster:
        until(lambda: len(alive_brokers(cluster)) == 3, "three brokers registered")
        with Client(cluster.coordinator.address) as client:
            client.admin.create_topic("solo", 1, replication_factor=1)
            old = describe(cluster, "solo", 0).broker_id
            with client.producer("solo") as producer:
                for f in [producer.send(b"s%03d" % i) for i in range(100)]:
                    f.result(timeout=30)
            cluster.start_broker(3)
            until(lambda: 3 in alive_brokers(cluster), "broker 3 registered")
            client.admin.reassign_partitions({("solo", 0): [3]})
            until(lambda: not describe(cluster, "solo", 0).removing_replicas, "the move to complete")
            state = describe(cluster, "solo", 0)
            assert (list(state.replicas), state.broker_id, list(state.isr)) == ([3], 3, [3])
            until(lambda: not (cluster.data / f"b{old}" / "solo-0").exists(), "the old copy deleted")
            with client.producer("solo") as producer:
                producer.send(b"after").result(timeout=30)
        got = consume_all(cluster.coordinator.address, "solo", 0, 101)
        assert got == [b"s%03d" % i for i in range(100)] + [b"after"]


def test_a_replica_moved_away_while_its_broker_was_down_is_deleted_when_it_returns(tmp_path: Path) -> None:
    """Removals go to live brokers only: a broker down when its replica moved away lists its logs when it
    registers again, and the controller removes the strays (coordinator/cluster/strays.py). Before, the
    copy stayed on its disk for ever."""
    with cluster_of(tmp_path, session="2s") as cluster:
        until(lambda: len(alive_brokers(cluster)) == 3, "three brokers registered")
        with Client(cluster.coordinator.address) as client:
            client.admin.create_topic("away", 1, replication_factor=3, min_insync_replicas=2)
            with client.producer("away") as producer:
                for f in [producer.send(b"a%03d" % i) for i in range(50)]:
                    f.result(timeout=30)
            before = describe(cluster, "away", 0)
            gone = next(b for b in before.replicas if b != before.broker_id)  # a follower: no election
            copy = cluster.data / f"b{gone}" / "away-0"
            cluster.start_broker(3)
            until(lambda: 3 in alive_brokers(cluster), "broker 3 registered")
            cluster.brokers[gone].stop()
            until(lambda: gone not in alive_brokers(cluster), f"broker {gone}'s session to expire")
            target = [3 if b == gone else b for b in before.replicas]
            client.admin.reassign_partitions({("away", 0): target})
            until(lambda: not describe(cluster, "away", 0).removing_replicas, "the move to complete")
            assert list(describe(cluster, "away", 0).replicas) == target
            assert copy.exists()  # its broker was down: nobody could tell it
            cluster.start_broker(gone)
            until(lambda: gone in alive_brokers(cluster), f"broker {gone} back")
            until(lambda: not copy.exists(), f"broker {gone}'s stray copy deleted")
            # The other replicas keep theirs, and the partition is whole.
            assert all((cluster.data / f"b{b}" / "away-0").exists() for b in target)
        assert consume_all(cluster.coordinator.address, "away", 0, 50) == [b"a%03d" % i for i in range(50)]
