"""The leader-kill campaign of issue 14 (must-shows 1 and 7), in full: three brokers, factor 3, min ISR 2,
an SDK producer at a steady rate (acks=all) over several partitions; ``--kills`` times kill -9 the leader of
partition 0 and restart it (waiting until it is back in every ISR), and kill -9 the coordinator once. Then
every partition is read back and checked against what the producer was told.

Run with idempotence (the SDK default) and without, one after the other: the counts of loss, duplicates,
order and gaps for each, and per kill the requests in flight, the producer's retries, the time without a
leader and the longest produce stall. The scenario is the suite's (``tests/chaos/leader_kills.py``); the
suite runs 3 kills (``tests/chaos/test_leader_kills.py``).

    python bench/chaos/leader_kills.py --kills 10 --rate 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "services"))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from tests.chaos.leader_kills import Campaign, run  # noqa: E402

from _stack import save  # noqa: E402


def _spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} s, max {max(xs):.2f} s" if xs else "-"


def _report(mode: str, campaign: Campaign) -> str:
    summary, v, kills = campaign.summary(), campaign.verdict, campaign.kills
    return "\n".join(
        [
            f"\n== {mode}: {len(kills)} leader kills, {campaign.coordinator_kills} coordinator kill(s), "
            f"{campaign.seconds:.0f} s",
            f"acknowledged {v.acked}, consumed {v.consumed}: lost {v.lost}, duplicates {v.duplicates}, "
            f"out of order {v.out_of_order}, gaps {v.gaps}, "
            f"written though unacknowledged {v.unacked_written}",
            f"failed sends {dict(campaign.failed_sends)}; replicas identical: {campaign.replicas_identical}; "
            f"elections {campaign.elections} (false: {summary['false_elections']})",
            f"kills with requests in flight {summary['kills_with_requests_in_flight']}/{len(kills)}, "
            f"with retries {summary['kills_with_retries']}/{len(kills)} "
            f"(retries per kill {summary['retries_per_kill']}, errors {summary['retry_errors']})",
            f"leaderless after a kill: {_spread([k.leaderless for k in kills])}; "
            f"longest produce stall on the partition: {_spread([k.stall for k in kills])}; "
            f"back in sync: {_spread([k.back_in_sync for k in kills])}; "
            f"coordinator back in {campaign.coordinator_back:.2f} s",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--rate", type=float, default=1_000, help="records/s the producer sends")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--session", default="3s", help="the coordinator's broker session timeout")
    parser.add_argument(
        "--coordinator-kill-after", type=int, default=5, help="kill the coordinator after kill N"
    )
    parser.add_argument(
        "--modes", default="idempotent,plain", help="comma-separated: idempotent, plain (no idempotence)"
    )
    args = parser.parse_args()

    results: dict[str, object] = {
        "kills": args.kills,
        "rate": args.rate,
        "partitions": args.partitions,
        "session": args.session,
    }
    failed = False
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory(prefix=f"sluice-chaos-{mode}-") as d:
            campaign: Campaign = run(
                Path(d),
                args.kills,
                idempotent=mode == "idempotent",
                partitions=args.partitions,
                rate=args.rate,
                session=args.session,
                coordinator_kill_after=min(args.coordinator_kill_after, args.kills),
            )
        summary = campaign.summary()
        results[mode] = summary
        v = campaign.verdict
        print(_report(mode, campaign))
        busy = all(k.in_flight > 0 and sum(k.retries.values()) > 0 for k in campaign.kills)
        if mode == "idempotent" and (v.lost or v.duplicates or v.out_of_order or v.gaps or not busy):
            failed = True
        if v.lost:
            failed = True
    save("chaos_leader_kills", results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
