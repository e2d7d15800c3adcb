"""Must-show 8 (b): the Redis primary is paused (SIGSTOP) while the controller elects a partition leader
(docs/replication.md, "Controller state that cannot roll back"). Real processes: a Redis primary, a
replica and a Sentinel; a coordinator following them (``redis+sentinel://``, ``--metadata-replicas 1``);
three brokers and a topic at factor 3, min ISR 2.

The leader is killed; before its session expires the Redis primary is paused, so the election's write hits
a primary that does not answer. The Sentinel promotes the replica; the paused primary is resumed and
becomes the new primary's replica. The controller follows the new primary (its election is retried until
a write is held by a replica), and the partition ends with exactly one leader, not the dead broker, serving
acks=all writes, with every record acknowledged before. No broker ever accepted an epoch that went
backwards (each assignment journal's epochs only grow), and the state the controller persisted on the new
primary is the one it serves. (Part (a), the primary killed under group commits acknowledged with WAIT, is
``tests/integration/offsetstore/test_redis_failover.py``.)
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import redis

from sluice.v1 import common_pb2
from tests.harness import SentinelSet, run_redis_sentinel, start_service

from .conftest import make_batch, part, vals
from .test_controller_rebuild import _journal_epochs
from .test_replication import BROKERS, Cluster, create, high_watermark, until


def _replica_online(primary_port: int, timeout: float = 30) -> None:
    """Until the primary's replica finished its sync: before that WAIT counts it as holding nothing."""
    deadline = time.monotonic() + timeout
    with redis.Redis(port=primary_port, socket_timeout=2) as r:
        while r.info("replication").get("slave0", {}).get("state") != "online":
            assert time.monotonic() < deadline, "the replica never came online"
            time.sleep(0.1)


def _failed_over(sentinels: SentinelSet, old_primary: int, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            port = sentinels.primary_port()
            if port != old_primary:
                return port
        except redis.RedisError:
            pass
        assert time.monotonic() < deadline, "the Sentinel did not promote the replica"
        time.sleep(0.1)


def test_a_redis_primary_paused_during_a_leader_election_loses_no_epoch_and_ends_with_one_leader(
    tmp_path: Path,
) -> None:
    with run_redis_sentinel(down_after_ms=500) as sentinels:
        for server in (sentinels.primary, sentinels.replica):  # a resync at once, not after 5 s
            with redis.Redis(port=server.port) as r:
                r.config_set("repl-diskless-sync-delay", 0)
        _replica_online(sentinels.primary.port)
        coordinator = start_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", sentinels.url,
            "--metadata-replicas", "1",
            "--broker-heartbeat-interval", "200ms", "--broker-session-timeout", "3s",
        )  # fmt: skip
        cluster = Cluster(coordinator, tmp_path)
        paused = False
        try:
            for broker_id in range(BROKERS):
                cluster.start_broker(broker_id)
            create(cluster, "rf")
            before = cluster.partition("rf")
            old_id = before.broker_id
            old = cluster.brokers[old_id]
            for i in range(5):
                answer = old.produce("rf", 0, make_batch(vals(2, prefix=f"a{i}-")), acks=-1)
                assert answer.error.code == common_pb2.NONE, answer.error.message
            acked = 10

            old.kill()  # its session (3 s) expires while Redis is paused: the election meets it
            old.close()
            time.sleep(1.0)
            os.kill(sentinels.primary.process.pid, signal.SIGSTOP)
            paused = True
            new_primary = _failed_over(sentinels, sentinels.primary.port)
            time.sleep(1.0)  # the controller's election write is failing meanwhile
            os.kill(sentinels.primary.process.pid, signal.SIGCONT)
            paused = False

            until(
                lambda: cluster.partition("rf").broker_id not in (old_id, -1),
                "a leader elected on the new Redis primary",
                timeout=45,
            )
            now = cluster.partition("rf")
            assert now.leader_epoch > before.leader_epoch
            assert old_id not in now.isr
            leader = cluster.brokers[now.broker_id]
            until(
                lambda: (
                    leader.produce("rf", 0, make_batch(vals(1, prefix="b")), acks=-1).error.code
                    == common_pb2.NONE
                ),
                "an acks=all write on the new leader",
                timeout=30,
            )
            assert high_watermark(leader, "rf") >= acked + 1
            fetched = leader.fetch(part("rf", 0), max_bytes=1 << 20).partitions[0]
            assert fetched.next_offset >= acked + 1  # every record acknowledged before the failover
            other = next(b for b in cluster.brokers if b not in (old_id, now.broker_id))
            assert cluster.brokers[other].produce("rf", 0, make_batch(vals(1))).error.code == (
                common_pb2.NOT_LEADER
            )
            # The controller followed the new primary: what it serves is what that primary holds.
            with redis.Redis(port=new_primary) as r:
                record = r.hget("sluice:coordinator:records", "topic:rf") or b""
            assert f'"leader_epoch":{now.leader_epoch}'.encode() in record.replace(b" ", b"")
            log = coordinator.log()
            assert re.search(r"leader elections \(broker \d+ gone\) failed .*retrying", log), (
                "no election met the pause"
            )
            # No broker accepted an epoch that went backwards.
            for broker_id in cluster.brokers:
                epochs = _journal_epochs(tmp_path / f"b{broker_id}", "rf")
                assert epochs == sorted(epochs), (broker_id, epochs)
        finally:
            if paused:
                os.kill(sentinels.primary.process.pid, signal.SIGCONT)
            for broker in cluster.brokers.values():
                if broker.alive():
                    broker.stop()
            coordinator.terminate()
