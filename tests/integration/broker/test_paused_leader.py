"""Must-show 3 of issue 14, a paused leader (docs/replication.md, "Failover"): SIGSTOP the leader for longer
than its session, let a new leader take acks=all writes, then SIGCONT with writes already queued at the old
leader.

- no split brain: the old leader never acknowledges an acks=all write after it lost the leadership (its
  followers follow the new leader, so its high watermark cannot move), whatever it learns first on waking;
- an acks=1 write it may still take in that instant is in an older leader epoch: it is truncated when the
  old leader follows the new one (OffsetForLeaderEpoch), never seen by a consumer, and the two logs end
  byte for byte equal;
- nothing acknowledged is lost.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import grpc

from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2

from .conftest import make_batch, part, records, vals
from .test_replication import cluster_of, create, high_watermark, isr, until


def _produce_request(prefix: str, acks: int) -> pb.ProduceRequest:
    batch = make_batch(vals(2, prefix=prefix))
    return pb.ProduceRequest(
        acks=acks, partitions=[pb.ProducePartition(topic="pause", partition=0, records=batch)]
    )


def test_a_paused_leader_is_fenced_and_its_late_writes_are_truncated(tmp_path: Path) -> None:
    with cluster_of(tmp_path, session="3s") as cluster:
        create(cluster, "pause")
        state = cluster.partition("pause")
        old_id = state.broker_id
        old = cluster.brokers[old_id]
        acked: list[bytes] = []
        for i in range(5):
            answer = old.produce("pause", 0, make_batch(vals(2, prefix=f"a{i}-")), acks=-1)
            assert answer.error.code == common_pb2.NONE, answer.error.message
            acked += vals(2, prefix=f"a{i}-")
        old.proc.process.send_signal(signal.SIGSTOP)
        try:
            until(
                lambda: cluster.partition("pause").broker_id not in (old_id, -1), "a new leader", timeout=20
            )
            now = cluster.partition("pause")
            assert now.leader_epoch == state.leader_epoch + 1
            new = cluster.brokers[now.broker_id]
            until(lambda: high_watermark(new, "pause") == 10, "the new leader's HW over the acked records")
            for i in range(5):
                answer = new.produce("pause", 0, make_batch(vals(2, prefix=f"b{i}-")), acks=-1)
                assert answer.error.code == common_pb2.NONE, answer.error.message
                acked += vals(2, prefix=f"b{i}-")
            # Queued while it sleeps: the paused process reads them the moment it wakes, maybe before it
            # hears that it was deposed.
            late_one = old.stub.Produce.future(_produce_request("stale1-", 1), timeout=20)
            late_all = old.stub.Produce.future(_produce_request("staleall-", -1), timeout=20)
            time.sleep(0.2)
        finally:
            old.proc.process.send_signal(signal.SIGCONT)
        try:
            answer_all = int(late_all.result().partitions[0].error.code)
        except grpc.RpcError:
            answer_all = -1
        # No split brain: a deposed leader never acknowledges acks=all.
        assert answer_all != common_pb2.NONE
        try:
            answer_one = int(late_one.result().partitions[0].error.code)
        except grpc.RpcError:
            answer_one = -1
        # Taken (then truncated below) or refused: either way it must not survive.
        print(f"paused leader on waking: acks=1 -> {answer_one}, acks=all -> {answer_all}")
        # The old leader follows the new one, truncates what it took alone, and catches up.
        until(lambda: isr(cluster, "pause") == [0, 1, 2], "the old leader back in the ISR", timeout=30)
        until(
            lambda: cluster.segments(old_id, "pause") == cluster.segments(now.broker_id, "pause"),
            "the old leader to match the new one byte for byte",
            timeout=30,
        )
        assert b"stale" not in cluster.segments(now.broker_id, "pause")
        fetched = new.fetch(part("pause", 0), max_bytes=1 << 20).partitions[0]
        assert fetched.error.code == common_pb2.NONE
        seen = [r.value for r in records(fetched)]
        assert seen == acked  # every acknowledged record, once, in order; nothing the old leader took alone
        answer = old.produce("pause", 0, make_batch(vals(1)), acks=-1)
        assert answer.error.code == common_pb2.NOT_LEADER
