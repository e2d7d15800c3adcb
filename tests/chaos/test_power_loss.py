"""Issue 14, must-show 4 (the Jepsen NATS cases), short versions: three real brokers under the power-loss
seam, factor 3, min ISR 2, an ``acks=all`` idempotent producer at load (docs/replication.md, "Power loss
and corruption"; the long campaign is ``bench/chaos/power_loss.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.client import Client
from tests.chaos.power import Load, power_cluster, until, verify


@pytest.mark.parametrize("victim", ["leader", "follower"])
def test_power_loss_of_one_replica_loses_nothing_acknowledged(tmp_path: Path, victim: str) -> None:
    with power_cluster(tmp_path, flush="interval") as cluster, Client(cluster.coordinator.address) as client:
        load = Load(client)
        load.wait_acked(4000)  # about 2 s: flushed segments, and an unflushed tail
        leader = cluster.leader()
        gone = leader if victim == "leader" else (leader + 1) % 3
        lost = cluster.power_loss(gone)
        if victim == "leader":
            until(lambda: cluster.leader() not in (gone, -1), "a new leader")
        load.wait_acked(1000)  # acks=all goes on with the two others
        cluster.start(gone)
        until(lambda: gone in cluster.partition().isr, f"broker {gone} back in the ISR")
        load.wait_acked(500)
        acked = load.stop()
        now = cluster.leader()
        until(lambda: cluster.segments(gone) == cluster.segments(now), "the recovered replica matching")
        verdict = verify(cluster, acked)
        print(f"power loss of the {victim}: {lost}; {verdict}")
        assert lost["cut_bytes"] > 0 or lost["removed"] > 0  # the cut did cut something
        assert verdict.lost == 0
        assert verdict.duplicates == 0
        assert verdict.out_of_order == 0


def test_coordinated_power_loss_under_flush_always_loses_nothing_acknowledged(tmp_path: Path) -> None:
    with power_cluster(tmp_path, flush="always") as cluster, Client(cluster.coordinator.address) as client:
        load = Load(client)
        load.wait_acked(2000)
        for broker_id in range(3):  # kill -9 all three first: none outlives another
            cluster.kill(broker_id)
        lost = [cluster.power_loss(broker_id) for broker_id in range(3)]
        for broker_id in range(3):
            cluster.start(broker_id)
        load.wait_acked(1000)
        acked = load.stop()
        verdict = verify(cluster, acked)
        print(f"coordinated power loss (flush=always): {lost}; {verdict}")
        assert verdict.lost == 0
        assert verdict.duplicates == 0
        assert verdict.out_of_order == 0
