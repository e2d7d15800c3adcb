"""The replication data path with real processes (docs/replication.md, "The data path"): a coordinator on
a private Redis and three brokers; a topic with factor 3 and min ISR 2.

- acks=all is answered once every in-sync replica holds the batch, and then every replica's log is the
  leader's, byte for byte (segment files compared);
- consumers never see a record above the high watermark;
- a follower that stops (SIGSTOP) leaves the ISR after ``replica_lag_time_max`` (acks=all then goes on
  with the others, and is refused with NOT_ENOUGH_REPLICAS below min ISR, where the HW stops); after
  SIGCONT it catches up and rejoins;
- a leader killed with kill -9 is replaced from the ISR within the session timeout, keeps every
  acknowledged record, and returns as a follower that matches the new leader byte for byte;
- KIP-101: a leader that took acks=1 writes its followers never got dies; the new leader writes over
  those offsets in the next epoch; the old one returns and truncates exactly its divergent tail;
- a leader paused (SIGSTOP) past its session is replaced; resumed, its acks=all writes never commit, it
  refuses clients once it hears of the new epoch, and it follows the new leader byte for byte;
- a follower killed with kill -9 and restarted asks the leader where its log diverges
  (OffsetForLeaderEpoch), then catches up byte for byte; meanwhile the HW holds and consumers see
  nothing of what it lacks.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from sluice.broker.replica_fetcher import FETCH_MAX_WAIT_MS
from sluice.client import Client
from sluice.errors import InvalidReplicationFactor
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2, coordinator_pb2_grpc
from sluice.v1 import coordinator_pb2 as cpb
from tests.harness import ServiceProcess, run_redis, start_service

from .conftest import Broker, make_batch, part, start_tracked, vals

BROKERS = 3


@dataclass
class Cluster:
    coordinator: ServiceProcess
    data: Path
    brokers: dict[int, Broker] = field(default_factory=dict)
    flush: str = "interval"
    lag: str = "1s"

    @property
    def stub(self) -> coordinator_pb2_grpc.CoordinatorStub:
        return coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(self.coordinator.address))

    def start_broker(self, broker_id: int) -> Broker:
        proc, pumps = start_tracked(
            "broker",
            "--port", "0",
            "--metrics-port", "0",
            "--data-dir", str(self.data / f"b{broker_id}"),
            "--broker-id", str(broker_id),
            "--flush", self.flush,
            "--coordinator", self.coordinator.address,
            "--replica-lag-time-max", self.lag,
        )  # fmt: skip
        self.brokers[broker_id] = Broker(proc, self.data / f"b{broker_id}", pumps)
        return self.brokers[broker_id]

    def partition(self, topic: str) -> cpb.PartitionDescription:
        meta = self.stub.Metadata(cpb.MetadataRequest(topics=[topic]), timeout=10)
        return meta.topics[0].partitions[0]

    def segments(self, broker_id: int, topic: str) -> bytes:
        """Every segment file of partition 0 on one broker, in offset order."""
        directory = self.data / f"b{broker_id}" / f"{topic}-0"
        return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))


@contextlib.contextmanager
def cluster_of(
    tmp: Path,
    flush: str = "interval",
    lag: str = "1s",
    session: str = "5s",
    coordinator_args: tuple[str, ...] = (),
) -> Iterator[Cluster]:
    """``lag``: the brokers' --replica-lag-time-max; ``session``: the coordinator's broker session timeout
    (a broker that misses it loses its leaderships and ISR places: failover)."""
    with run_redis(appendonly=False) as redis:
        coordinator = start_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url,
            "--broker-heartbeat-interval", "200ms", "--broker-session-timeout", session,
            *coordinator_args,
        )  # fmt: skip
        cluster = Cluster(coordinator, tmp, flush=flush, lag=lag)
        try:
            for broker_id in range(BROKERS):
                cluster.start_broker(broker_id)
            yield cluster
        finally:
            for broker in cluster.brokers.values():
                if broker.alive():
                    broker.stop()
            coordinator.terminate()


def create(cluster: Cluster, topic: str) -> None:
    """Factor 3, min ISR 2; retried while the brokers are still registering."""
    deadline = time.monotonic() + 30
    with Client(cluster.coordinator.address) as client:
        while True:
            try:
                client.admin.create_topic(topic, replication_factor=3, min_insync_replicas=2)
                return
            except InvalidReplicationFactor:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def isr(cluster: Cluster, topic: str) -> list[int]:
    return sorted(cluster.partition(topic).isr)


def high_watermark(broker: Broker, topic: str) -> int:
    return broker.fetch(part(topic), max_wait_ms=0).partitions[0].high_watermark


def test_acks_all_replicates_byte_for_byte_and_consumers_stop_at_the_high_watermark(tmp_path: Path) -> None:
    with cluster_of(tmp_path) as cluster:
        create(cluster, "rep")
        state = cluster.partition("rep")
        assert sorted(state.replicas) == [0, 1, 2]
        leader = cluster.brokers[state.broker_id]
        followers = [b for i, b in cluster.brokers.items() if i != state.broker_id]

        offsets = []
        for i in range(20):
            answer = leader.produce("rep", 0, make_batch(vals(5, prefix=f"r{i}-")), acks=-1)
            assert answer.error.code == common_pb2.NONE, answer.error.message
            offsets.append(answer.base_offset)
        assert offsets == list(range(0, 100, 5))
        # Answered means committed: the HW is past it, and every replica holds it (the leader's bytes,
        # stamped offsets, append times and leader epoch included).
        assert high_watermark(leader, "rep") == 100
        leader_bytes = cluster.segments(state.broker_id, "rep")
        for follower_id in (i for i in cluster.brokers if i != state.broker_id):
            assert cluster.segments(follower_id, "rep") == leader_bytes
        # The followers fetch over the leader's wire port (one connection each).
        wire = leader.metric("sluice_broker_wire_connections")
        assert wire is not None
        assert wire >= 2
        # A follower does not serve clients: it names the leader.
        assert followers[0].fetch(part("rep")).partitions[0].error.code == common_pb2.NOT_LEADER

        # ListOffsets latest is the HW.
        assert leader.offsets("rep", -1).offset == 100

        # A consumer's long-poll from the HW wakes once the next acks=all batch is committed.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            parked = pool.submit(leader.fetch, part("rep", 100), max_wait_ms=20_000)
            time.sleep(0.3)
            assert not parked.done()
            answer = leader.produce("rep", 0, make_batch(vals(1)), acks=-1)
            assert answer.error.code == common_pb2.NONE
            got = parked.result(10).partitions[0]
        assert got.high_watermark == 101
        assert got.records


def test_a_follower_killed_and_restarted_checks_its_divergence_and_catches_up_byte_for_byte(
    tmp_path: Path,
) -> None:
    # Neither the leader's lag rule nor the controller's session expiry may take it out of the ISR here.
    with cluster_of(tmp_path, lag="60s", session="60s") as cluster:
        create(cluster, "crash")
        state = cluster.partition("crash")
        leader = cluster.brokers[state.broker_id]
        victim_id = next(i for i in cluster.brokers if i != state.broker_id)
        for i in range(10):
            assert leader.produce("crash", 0, make_batch(vals(3, prefix=f"a{i}-")), acks=-1).error.code == 0
        cluster.brokers[victim_id].kill()  # kill -9
        cluster.brokers[victim_id].close()
        # The other follower keeps the ISR at min ISR... it still names the dead one until the controller
        # shrinks it, so these are acks=1: in the leader's log, not committed.
        for i in range(10):
            assert leader.produce("crash", 0, make_batch(vals(3, prefix=f"b{i}-")), acks=1).error.code == 0
        # The ISR still holds the dead follower: the HW stays at 30 and a consumer sees nothing above it,
        # though the leader's log ends at 60 (an offset between them is in range: an empty answer).
        assert high_watermark(leader, "crash") == 30
        above = leader.fetch(part("crash", 30)).partitions[0]
        assert above.error.code == common_pb2.NONE
        assert above.records == b""
        everything = leader.fetch(part("crash", 0), max_bytes=1 << 20).partitions[0]
        assert everything.next_offset == 30
        restarted = cluster.start_broker(victim_id)
        assert restarted.alive()
        until(
            lambda: cluster.segments(victim_id, "crash") == cluster.segments(state.broker_id, "crash"),
            "the restarted follower to match the leader byte for byte",
        )
        # Caught up, it counts for the HW again: all 60 records are committed.
        until(lambda: high_watermark(leader, "crash") == 60, "the HW to reach the log end")


def test_under_flush_always_acks_all_is_answered_once_min_isr_replicas_fsynced(tmp_path: Path) -> None:
    with cluster_of(tmp_path, flush="always") as cluster:
        create(cluster, "durable")
        state = cluster.partition("durable")
        leader = cluster.brokers[state.broker_id]
        for i in range(5):
            answer = leader.produce("durable", 0, make_batch(vals(2, prefix=f"d{i}-")), acks=-1)
            assert answer.error.code == common_pb2.NONE, answer.error.message
        assert high_watermark(leader, "durable") == 10
        fetched = leader.fetch(pb.FetchPartition(topic="durable", partition=0, fetch_offset=0)).partitions[0]
        assert fetched.high_watermark == 10


def test_a_stopped_follower_leaves_the_isr_and_rejoins_after_it_catches_up(tmp_path: Path) -> None:
    # The leader's lag rule (2 s) takes the stopped followers out, not the controller's session expiry.
    # (2 s, not less: on a loaded machine a healthy follower can go a second without a fetch.)
    with cluster_of(tmp_path, lag="2s", session="60s") as cluster:
        create(cluster, "lag")
        state = cluster.partition("lag")
        leader = cluster.brokers[state.broker_id]
        first, second = (i for i in sorted(cluster.brokers) if i != state.broker_id)
        stopped: list[int] = []
        try:
            assert leader.produce("lag", 0, make_batch(vals(5)), acks=-1).error.code == common_pb2.NONE
            cluster.brokers[first].proc.process.send_signal(signal.SIGSTOP)
            stopped.append(first)
            # acks=all waits for the stopped follower until it leaves the ISR (2 s), then commits with the
            # leader and the other follower: min ISR 2 still holds.
            started = time.monotonic()
            answer = leader.produce("lag", 0, make_batch(vals(5)), acks=-1)
            assert answer.error.code == common_pb2.NONE, answer.error.message
            assert time.monotonic() - started >= 0.5
            until(lambda: isr(cluster, "lag") == sorted((state.broker_id, second)), "the ISR to shrink")
            assert high_watermark(leader, "lag") == 10

            # The second follower stops too: the ISR shrinks to the leader alone, below min ISR. Writes with
            # acks=1 stay above the HW, which stops (strict min ISR), and acks=all is refused up front.
            cluster.brokers[second].proc.process.send_signal(signal.SIGSTOP)
            stopped.append(second)
            assert leader.produce("lag", 0, make_batch(vals(5)), acks=1).error.code == common_pb2.NONE
            until(lambda: isr(cluster, "lag") == [state.broker_id], "the ISR to shrink to the leader")
            refused = leader.produce("lag", 0, make_batch(vals(1)), acks=-1)
            assert refused.error.code == common_pb2.NOT_ENOUGH_REPLICAS
            assert high_watermark(leader, "lag") == 10
            assert leader.fetch(part("lag", 10)).partitions[0].records == b""
            assert leader.offsets("lag", -1).offset == 10

            for broker_id in stopped:
                cluster.brokers[broker_id].proc.process.send_signal(signal.SIGCONT)
            stopped.clear()
            until(lambda: isr(cluster, "lag") == [0, 1, 2], "both followers to rejoin the ISR")
            until(lambda: high_watermark(leader, "lag") == 15, "the HW to cover the acks=1 batch")
            until(
                lambda: all(
                    cluster.segments(f, "lag") == cluster.segments(state.broker_id, "lag")
                    for f in (first, second)
                ),
                "the followers to match the leader byte for byte",
            )
            assert leader.produce("lag", 0, make_batch(vals(1)), acks=-1).error.code == common_pb2.NONE
            # At least the two stops (a loaded machine may add a false shrink and its rejoin).
            shrinks = leader.metric("sluice_broker_isr_shrinks_total")
            expands = leader.metric("sluice_broker_isr_expands_total")
            assert shrinks is not None
            assert shrinks >= 2
            assert expands is not None
            assert expands >= 2
            assert leader.metric("sluice_broker_under_replicated_partitions") == 0
        finally:
            for broker_id in stopped:
                cluster.brokers[broker_id].proc.process.send_signal(signal.SIGCONT)


def test_a_killed_leader_is_replaced_from_the_isr_and_returns_as_a_follower(tmp_path: Path) -> None:
    with cluster_of(tmp_path) as cluster:
        create(cluster, "fail")
        state = cluster.partition("fail")
        old_id = state.broker_id
        old = cluster.brokers[old_id]
        for i in range(10):
            answer = old.produce("fail", 0, make_batch(vals(3, prefix=f"a{i}-")), acks=-1)
            assert answer.error.code == common_pb2.NONE, answer.error.message
        old.kill()  # kill -9: its session expires (5 s) and the controller elects from the ISR
        old.close()
        started = time.monotonic()
        until(lambda: cluster.partition("fail").broker_id not in (old_id, -1), "a new leader", timeout=15)
        elected_after = time.monotonic() - started
        now = cluster.partition("fail")
        assert now.leader_epoch == state.leader_epoch + 1
        assert old_id not in now.isr
        leader = cluster.brokers[now.broker_id]
        # Every acknowledged record is on the new leader, and it takes acks=all writes with the other
        # follower (ISR 2 = min ISR) once that one follows it.
        until(lambda: high_watermark(leader, "fail") == 30, "the new leader's HW to cover the acked records")
        until(
            lambda: (
                leader.produce("fail", 0, make_batch(vals(3, prefix="b")), acks=-1).error.code
                == common_pb2.NONE
            ),
            "an acks=all write on the new leader",
        )
        fetched = leader.fetch(part("fail", 0), max_bytes=1 << 20).partitions[0]
        assert fetched.next_offset >= 33
        # The old leader comes back as a follower and ends up with the new leader's log, byte for byte.
        cluster.start_broker(old_id)
        until(lambda: isr(cluster, "fail") == [0, 1, 2], "the old leader to rejoin the ISR", timeout=20)
        until(
            lambda: cluster.segments(old_id, "fail") == cluster.segments(now.broker_id, "fail"),
            "the old leader to match the new one byte for byte",
        )
        # The session timeout, plus the expiry tick and a push, with room for a loaded machine (the
        # failover time itself is a bench figure, not a test's).
        assert elected_after < 5 + 5
        metrics = urllib.request.urlopen(f"http://{cluster.coordinator.metrics}/metrics", timeout=5).read()
        assert b'sluice_coordinator_leader_elections_total{kind="clean"} 1.0' in metrics


def test_a_deposed_leader_truncates_exactly_its_unreplicated_tail_kip_101(tmp_path: Path) -> None:
    # A 10 s session: the followers are down for a few seconds without the controller noticing.
    with cluster_of(tmp_path, lag="60s", session="10s") as cluster:
        create(cluster, "div")
        state = cluster.partition("div")
        old_id = state.broker_id
        old = cluster.brokers[old_id]
        followers = [i for i in sorted(cluster.brokers) if i != old_id]
        for i in range(5):
            assert old.produce("div", 0, make_batch(vals(2, prefix=f"c{i}-")), acks=-1).error.code == 0
        until(
            lambda: all(cluster.segments(f, "div") == cluster.segments(old_id, "div") for f in followers),
            "the followers to hold the committed records",
        )
        # The followers stop (frozen: a follower killed and restarted would report an unclean shutdown
        # and leave the ISR, KIP-966, leaving the old leader the last eligible replica); the leader takes
        # acks=1 writes they never get, then dies.
        for f in followers:
            cluster.brokers[f].proc.process.send_signal(signal.SIGSTOP)
        # A fetch each follower parked before it froze is answered (empty) within its max wait; only
        # then are the writes below sure to reach neither (a frozen process sends no new fetch). Nothing
        # to wait on from here: the answer goes to a frozen process.
        time.sleep(3 * FETCH_MAX_WAIT_MS / 1000)
        for i in range(3):
            assert old.produce("div", 0, make_batch([b"lost-%d" % i]), acks=1).error.code == 0
        assert high_watermark(old, "div") == 10  # never committed: no consumer saw them
        old.kill()
        old.close()
        for f in followers:
            cluster.brokers[f].proc.process.send_signal(signal.SIGCONT)
        until(lambda: cluster.partition("div").broker_id in followers, "a new leader", timeout=30)
        new_id = cluster.partition("div").broker_id
        leader = cluster.brokers[new_id]
        # The new leader takes writes in the next epoch, at the offsets the lost records had.
        until(
            lambda: (
                leader.produce("div", 0, make_batch(vals(2, prefix="n")), acks=-1).error.code
                == common_pb2.NONE
            ),
            "an acks=all write on the new leader",
        )
        assert b"lost-" not in cluster.segments(new_id, "div")
        # The old leader returns: it truncates its divergent tail (to where epochs agree: not its HW,
        # not everything) and ends up with the new leader's log byte for byte.
        cluster.start_broker(old_id)
        until(
            lambda: cluster.segments(old_id, "div") == cluster.segments(new_id, "div"),
            "the old leader to match the new one byte for byte",
        )
        assert b"lost-" not in cluster.segments(old_id, "div")
        assert "diverges from leader" in cluster.brokers[old_id].proc.log()


def test_a_paused_leader_is_replaced_and_its_writes_are_fenced_when_it_resumes(tmp_path: Path) -> None:
    with cluster_of(tmp_path, lag="60s") as cluster:
        create(cluster, "pause")
        state = cluster.partition("pause")
        old_id = state.broker_id
        old = cluster.brokers[old_id]
        for i in range(5):
            assert old.produce("pause", 0, make_batch(vals(2, prefix=f"p{i}-")), acks=-1).error.code == 0
        old.proc.process.send_signal(signal.SIGSTOP)  # longer than its session: it is replaced
        try:
            until(
                lambda: cluster.partition("pause").broker_id not in (old_id, -1), "a new leader", timeout=15
            )
        finally:
            old.proc.process.send_signal(signal.SIGCONT)
        new_id = cluster.partition("pause").broker_id
        leader = cluster.brokers[new_id]
        until(
            lambda: (
                leader.produce("pause", 0, make_batch(vals(2, prefix="n")), acks=-1).error.code
                == common_pb2.NONE
            ),
            "an acks=all write on the new leader",
        )
        # Resumed, the old leader may still believe it leads for a heartbeat: an acks=all write there
        # never commits (its followers left it), and once it hears of the new epoch it refuses clients.
        answer = old.stub.Produce(
            pb.ProduceRequest(
                acks=-1,
                timeout_ms=1000,
                partitions=[pb.ProducePartition(topic="pause", partition=0, records=make_batch([b"fenced"]))],
            ),
            timeout=10,
        ).partitions[0]
        assert answer.error.code != common_pb2.NONE
        until(
            lambda: old.produce("pause", 0, make_batch(vals(1))).error.code == common_pb2.NOT_LEADER,
            "the old leader to refuse clients",
        )
        # No split brain: it follows the new leader, byte for byte, without the fenced write.
        until(
            lambda: cluster.segments(old_id, "pause") == cluster.segments(new_id, "pause"),
            "the old leader to match the new one byte for byte",
        )
        assert b"fenced" not in cluster.segments(new_id, "pause")
        assert high_watermark(leader, "pause") >= 12  # every acknowledged record is committed there
