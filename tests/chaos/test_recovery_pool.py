"""The unclean-recovery pool across a coordinator failover, and the operator's recovery, with real processes
(docs/replication.md, "Unclean shutdowns and damaged replicas" and "Operator recovery"): three brokers under
the power-loss seam, factor 3, min ISR 2, an ``acks=all`` idempotent producer at load, a coordinator on a
fixed port that is killed (``kill -9``) and restarted.

- every replica is killed at once and stays down past its session (offline); the last eligible one also
  loses its unsynced tail (a power cut). The other two restart first (unclean: their logs go into the
  pool), then the **coordinator is killed and restarted**, then the last eligible one returns. The new
  term elects the longest log, a replica that reported to the *previous* term: 0 acknowledged records
  lost. With the pool in memory (before), the new term knew only the short log and elected it alone.
- the last eligible replica never returns: the partition stays offline; ``sluice topic recover`` says
  (dry run) who would lead and which replica is gone, refuses without confirmation, and with it elects the
  longest returned log: the partition serves again, 0 acknowledged records lost (the kill kept the page
  caches), and the gone replica, when it returns at last, follows it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from sluice.client import Client
from tests.chaos.power import Load, PowerCluster, until, verify
from tests.harness import ServiceProcess, free_port, run_redis, start_service


def _coordinator(port: int, redis_url: str) -> ServiceProcess:
    return start_service(
        "coordinator", "--port", str(port), "--metrics-port", "0", "--redis-url", redis_url,
        "--broker-heartbeat-interval", "200ms", "--broker-session-timeout", "3s", "--election", "redis",
        # A killed coordinator's lease must not hold its successor (same address) back for long.
        "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "300ms",
    )  # fmt: skip


@contextlib.contextmanager
def _cluster(root: Path) -> Iterator[tuple[PowerCluster, str]]:
    with run_redis(appendonly=False) as redis:
        port = free_port()
        cluster = PowerCluster(root, _coordinator(port, redis.url), "interval")
        try:
            for broker_id in range(3):
                cluster.start(broker_id)
            cluster.create_topic()
            yield cluster, redis.url
        finally:
            for broker in cluster.brokers.values():
                broker.terminate()
            cluster.coordinator.terminate()


def _all_down_past_their_sessions(cluster: PowerCluster) -> tuple[int, list[int]]:
    """kill -9 every broker at once; once the partition is offline: its last eligible replica (the one
    whose registration decides) and the others."""
    for broker_id in range(3):
        cluster.kill(broker_id)
    until(lambda: cluster.leader() == -1, "the partition offline", timeout=30)
    state = cluster.partition()
    eligible = [*state.isr, *state.elr]
    assert eligible, state
    last = eligible[-1]
    return last, [b for b in range(3) if b != last]


def _unclean_registered(cluster: PowerCluster, broker_id: int) -> bool:
    return f"broker {broker_id} restarted after an unclean shutdown" in cluster.coordinator.log()


def test_the_recovery_pool_survives_a_coordinator_failover(tmp_path: Path) -> None:
    with _cluster(tmp_path) as (cluster, redis_url), Client(cluster.coordinator.address) as client:
        load = Load(client)
        load.wait_acked(4000)
        last, others = _all_down_past_their_sessions(cluster)
        cut = cluster.power_loss(last)  # killed already: its files go back to their last fsync
        assert sum(cut.values()) > 0, "the last eligible replica must lose a tail for the test to mean it"
        for b in others:
            cluster.start(b)
        until(lambda: all(_unclean_registered(cluster, b) for b in others), "the others' reports")
        assert cluster.leader() == -1  # they are not eligible: the partition waits for the last one
        port = cluster.coordinator.address.rsplit(":", 1)[1]
        cluster.coordinator.kill()
        cluster.coordinator = _coordinator(int(port), redis_url)
        until(lambda: "is the leader with epoch" in cluster.coordinator.log(), "the new term", timeout=30)
        cluster.start(last)
        until(lambda: cluster.leader() != -1, "a leader again", timeout=60)
        # The line is logged after the write that metadata shows: the output pump may lag behind.
        until(lambda: "UNCLEAN RECOVERY" in cluster.coordinator.log(), "the recovery's log line")
        leader = cluster.leader()
        assert leader in others, f"the new term elected {leader}, the short log, not one of {others}"
        load.wait_acked(500)
        acked = load.stop()
        verdict = verify(cluster, acked)
        print(f"pool across a coordinator failover: cut {cut}; {verdict}")
        assert verdict.lost == 0
        assert verdict.duplicates == 0
        assert verdict.out_of_order == 0


def _cli(cluster: PowerCluster, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice",
            "--bootstrap",
            cluster.coordinator.address,
            "topic",
            "recover",
            *args,
        ],
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
        check=False,
    )


def test_an_operator_recovers_a_partition_whose_eligible_replicas_never_return(tmp_path: Path) -> None:
    with _cluster(tmp_path) as (cluster, _), Client(cluster.coordinator.address) as client:
        load = Load(client)
        load.wait_acked(4000)
        last, others = _all_down_past_their_sessions(cluster)
        for b in others:
            cluster.start(b)
        until(lambda: all(_unclean_registered(cluster, b) for b in others), "the others' reports")
        time.sleep(1)
        assert cluster.leader() == -1, "offline while its last eligible replica is gone"

        dry = _cli(cluster, "power", "0", "--dry-run", "-f", "json")
        assert dry.returncode == 0, dry.stderr
        plan = json.loads(dry.stdout)
        assert plan["recovered"] is False
        assert plan["missing"] == [last]
        assert plan["leader"] in others
        assert {c["broker"] for c in plan["candidates"]} == set(others)
        assert plan["candidates"][0]["broker"] == plan["leader"]
        refused = _cli(cluster, "power", "0", stdin="no\n")
        assert refused.returncode == 1
        assert "Gone: broker(s)" in refused.stdout
        assert cluster.leader() == -1, "nothing changes without confirmation"

        done = _cli(cluster, "power", "0", stdin="power/0\n")
        assert done.returncode == 0, done.stderr
        assert f"Elected broker {plan['leader']}" in done.stdout
        until(lambda: cluster.leader() == plan["leader"], "the recovered leader serving", timeout=30)
        until(lambda: "OPERATOR RECOVERY" in cluster.coordinator.log(), "the recovery's log line")
        load.wait_acked(1000)
        cluster.start(last)  # back at last: a follower of the recovered log
        until(lambda: sorted(cluster.partition().isr) == [0, 1, 2], "the gone replica back in sync", 60)
        acked = load.stop()
        verdict = verify(cluster, acked)
        print(f"operator recovery: {verdict.lost} lost of {verdict.acked}")
        assert verdict.lost == 0
        assert verdict.duplicates == 0
        assert verdict.out_of_order == 0
