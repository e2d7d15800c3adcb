"""Key_Shared poison isolation, the long run (issue 17, "Poison"; docs/poison-keys.md).

Same workload as ``tests/integration/poison/test_poison_keys.py`` (``tests/integration/poison/workload.py``),
bigger: N records over 1,000 keys where one key carries ``--share`` percent and always fails, consumers
joining and leaving, parking caps exceeded many times over. Each round runs three modes back to back,
each on a fresh subscription: the same good records without the poison key, the poison key present and
succeeding, and the poison key failing; the figure is the good keys' rate, best of the rounds of each
(the machine is shared and noisy). Everything is counted: every good record
acknowledged, duplicates reported, every poison record in the DLQ, in order.

    PYTHONPATH=services:. python bench/poison_keys.py --records 200000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.poison.workload import Settings, check_dlq, produce, run
from tests.integration.push.conftest import run_push_cluster

from _stack import cpu_seconds
from sluice import Client


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--share", type=int, default=15, help="percent of the records on the poison key")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--park-max-messages", type=int, default=100)
    ap.add_argument("--max-redeliver", type=int, default=2)
    ap.add_argument("--nack-delay", default="100ms")
    args = ap.parse_args()
    settings = Settings(
        park_after=1,
        max_redeliver=args.max_redeliver,
        park_max_messages=args.park_max_messages,
        nack_delay=args.nack_delay,
        timeout=600,
    )
    with run_push_cluster() as cluster, Client(cluster.bootstrap, request_timeout=10) as client:
        pids = {"dispatcher": cluster.dispatcher.process.pid, "broker": cluster.broker.process.pid}

        def meter(into: dict[str, dict[str, float]], mode: str) -> Callable[[], None]:
            start = {k: cpu_seconds(pid) for k, pid in pids.items()}
            start["bench"] = time.process_time()

            def done() -> None:
                now = {k: cpu_seconds(pid) for k, pid in pids.items()}
                now["bench"] = time.process_time()
                into[mode] = {k: round(now[k] - start[k], 2) for k in now}

            return done

        base, poisoned = f"base-{uuid.uuid4().hex[:6]}", f"poison-{uuid.uuid4().hex[:6]}"
        client.admin.create_topic(base, partitions=1)
        client.admin.create_topic(poisoned, partitions=1)
        good, poison = produce(client, poisoned, args.records, args.share, with_poison=True)
        produce(client, base, args.records, args.share, with_poison=False)
        rows: list[dict[str, object]] = []
        rates: dict[str, list[float]] = {"absent": [], "healthy": [], "failing": []}
        for i in range(args.rounds):
            cpu: dict[str, dict[str, float]] = {}
            a = run(client, base, good, poison, poisoned=False, s=settings, on_done=meter(cpu, "absent"))
            h = run(client, poisoned, good, poison, poisoned=False, s=settings, on_done=meter(cpu, "healthy"))
            p = run(client, poisoned, good, poison, poisoned=True, s=settings, on_done=meter(cpu, "failing"))
            dlq_dup = check_dlq(p.dlq, poison)
            for name, o in (("absent", a), ("healthy", h), ("failing", p)):
                rates[name].append(o.rate)
            row: dict[str, object] = {
                "round": i,
                "rate_no_poison_key": round(a.rate),
                "rate_poison_key_healthy": round(h.rate),
                "rate_poison_key_failing": round(p.rate),
                "good_duplicates": [a.good_duplicates, h.good_duplicates, p.good_duplicates],
                "poison_records": len(poison),
                "poison_deliveries": p.poison_deliveries,
                "dlq_records": len(p.dlq),
                "dlq_duplicates": dlq_dup,
                "most_waiting_behind_a_head": p.max_waiting,
                "states_seen": sorted(p.states),
                # CPU seconds per process from the run's start to its last good record's first ack.
                "cpu_s": cpu,
                "load": os.getloadavg()[0],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        summary = {
            "records": args.records,
            "good_records": len(good),
            "poison_share": len(poison) / args.records,
            **{f"best_{k}": round(max(v)) for k, v in rates.items()},
            **{f"median_{k}": round(statistics.median(v)) for k, v in rates.items()},
            "failing_vs_healthy_best": round(max(rates["failing"]) / max(rates["healthy"]), 3),
            "failing_vs_absent_best": round(max(rates["failing"]) / max(rates["absent"]), 3),
        }
        print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
