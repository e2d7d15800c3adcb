"""Issue 14, must-show 4 (the Jepsen NATS cases), the long campaign: rounds of power loss and bit flips on
three real brokers (factor 3, min ISR 2, an acks=all idempotent producer at ~2,000 records/s), with the
power-loss seam of ``tests/chaos/fsync_ledger.py``. The short versions are ``tests/chaos/test_power_loss.py``.

Per round: one replica's power loss (leader, then follower; flush=interval), a coordinated power loss of
all three (flush=always, then flush=interval: the loss measured against the documented bound of one flush
interval), and bit flips in one replica (segment, index, epoch checkpoint, producer snapshot) followed by
the death of the two healthy ones. Reports per scenario the records acknowledged and lost, duplicates, and
for flush=interval how long before the power went the oldest lost record was acknowledged.

    python bench/chaos/power_loss.py --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(BENCH), str(BENCH.parent), str(BENCH.parent / "services")]

from tests.chaos.power import FLUSH_INTERVAL_S, TOPIC, Load, power_cluster, until, verify  # noqa: E402
from tests.chaos.test_power_loss import _flip_bits  # noqa: E402

from _stack import save  # noqa: E402
from sluice.client import Client  # noqa: E402


def one_replica(root: Path, victim: str, seconds: float) -> dict[str, Any]:
    with power_cluster(root, flush="interval") as cluster, Client(cluster.coordinator.address) as client:
        load = Load(client)
        time.sleep(seconds)
        leader = cluster.leader()
        gone = leader if victim == "leader" else (leader + 1) % 3
        cut = cluster.power_loss(gone)
        if victim == "leader":
            until(lambda: cluster.leader() not in (gone, -1), "a new leader")
        cluster.start(gone)
        started = time.monotonic()
        if victim == "follower":
            # Out at its registration (its unclean-shutdown report, KIP-966), or at its first fetch.
            until(lambda: gone not in cluster.partition().isr, "out of the ISR")
        until(lambda: gone in cluster.partition().isr, "back in the ISR")
        rejoined_s = time.monotonic() - started
        time.sleep(seconds / 2)
        verdict = verify(cluster, load.stop())
        return {"cut": cut, "rejoined_s": round(rejoined_s, 2), **_figures(verdict)}


def coordinated(root: Path, flush: str, seconds: float) -> dict[str, Any]:
    with (
        power_cluster(root, flush=flush, session="10s") as cluster,
        Client(cluster.coordinator.address) as client,
    ):
        load = Load(client)
        time.sleep(seconds)
        for broker_id in range(3):
            cluster.kill(broker_id)
        killed_at = time.monotonic()
        cut = [cluster.power_loss(broker_id) for broker_id in range(3)]
        for broker_id in range(3):
            cluster.start(broker_id)
        load.wait_acked(1000)
        verdict = verify(cluster, load.stop())
        ages = [killed_at - load.acked_at[v] for v in verdict.missing]
        return {
            "cut_bytes": sum(c["cut_bytes"] for c in cut),
            "oldest_lost_age_s": round(max(ages), 3) if ages else None,
            "within_bound": all(a <= FLUSH_INTERVAL_S + 1.0 for a in ages),
            **_figures(verdict),
        }


def bit_flips(root: Path, seconds: float) -> dict[str, Any]:
    with (
        power_cluster(root, flush="interval", segment_bytes=16 * 1024) as cluster,
        Client(cluster.coordinator.address) as client,
    ):
        load = Load(client)
        time.sleep(seconds)
        leader = cluster.leader()
        damaged = (leader + 1) % 3
        cluster.kill(damaged)
        bad = _flip_bits(cluster.data(damaged) / f"{TOPIC}-0")
        cluster.start(damaged)
        out = cluster.brokers[damaged]
        found = {
            "segment": f"batch at offset {bad[0]} is corrupt",
            "epoch_checkpoint": "leader-epoch-checkpoint is corrupt",
            "producer_snapshot": "is unusable",
            "refetch": f"damaged from offset {bad[0]}: re-fetching",
        }
        until(lambda: all(text in out.log() for text in found.values()), "every damage found")
        acked = load.stop()
        until(lambda: cluster.segments(damaged) == cluster.segments(leader), "healed")
        for healthy in {0, 1, 2} - {damaged}:
            cluster.kill(healthy)
        until(lambda: cluster.leader() == damaged, "the healed replica elected")
        cluster.start(leader)
        until(lambda: leader in cluster.partition().isr, "a follower back")
        return {"detected": sorted(found), **_figures(verify(cluster, acked))}


def _figures(verdict: Any) -> dict[str, Any]:
    return {"acked": verdict.acked, "lost": verdict.lost, "duplicates": verdict.duplicates}


def one_round(root: Path, seconds: float) -> dict[str, dict[str, Any]]:
    return {
        "one_replica_leader": one_replica(root / "a", "leader", seconds),
        "one_replica_follower": one_replica(root / "b", "follower", seconds),
        "coordinated_flush_always": coordinated(root / "c", "always", seconds),
        "coordinated_flush_interval": coordinated(root / "d", "interval", seconds),
        "bit_flips": bit_flips(root / "e", seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="power loss and bit flips on three brokers")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="load before each fault")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_no in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="sluice-power-") as tmp:
            for name, result in one_round(Path(tmp), args.seconds).items():
                print(f"round {round_no} {name}: {result}", flush=True)
                runs.setdefault(name, []).append(result)
    save("power_loss", {"rounds": args.rounds, "seconds": args.seconds, "runs": runs})


if __name__ == "__main__":
    main()
