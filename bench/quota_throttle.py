"""How closely a produce quota holds a client that ignores throttle_time_ms, over a long run.

    python bench/quota_throttle.py [--quota 2000000] [--seconds 60] [--window 16]

Starts a coordinator and a broker, sets ``client:hog``'s produce quota, and runs a raw wire producer
that pipelines ``--window`` 64 KiB requests and never waits for a throttle time, beside an unlimited
client producing one request at a time. Prints each client's rate per 5 s and the whole run's, and
saves them (``bench/results/quota_throttle.json``). The suite's short version:
``tests/integration/quota/test_throttle.py``.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "services"))
sys.path.insert(0, str(ROOT))

from tests.integration.quota.producers import Answers, wire_producer  # noqa: E402
from tests.integration.quota.test_throttle import _batch  # noqa: E402
from tests.wire_client import wire_address  # noqa: E402

from _stack import save, stack  # noqa: E402
from sluice import Client  # noqa: E402
from sluice.quotas.model import Kind, Limits, QuotaKey  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quota", type=int, default=2_000_000, help="bytes per second")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--window", type=int, default=16, help="the hog's requests in flight")
    parser.add_argument("--name", default="quota_throttle")
    args = parser.parse_args()
    with stack() as s, Client(s.bootstrap) as client:
        client.admin.create_topic("bench-quota", partitions=2)
        client.admin.alter_quotas({QuotaKey(Kind.CLIENT, "hog"): Limits(produce_bytes_per_second=args.quota)})
        wire = wire_address(s.broker.output)
        batch = _batch()
        results: dict[str, Answers] = {}

        def run(name: str, partition: int, window: int) -> None:
            results[name] = wire_producer(wire, name, "bench-quota", partition, batch, args.seconds, window)

        threads = [
            threading.Thread(target=run, args=("hog", 0, args.window)),
            threading.Thread(target=run, args=("other", 1, 1)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    start = min(r.rows[0][0] for r in results.values())
    rows = []
    for at in range(5, int(args.seconds) - 4, 5):
        row = {name: round(r.rate(start + at, start + at + 5)) for name, r in results.items()}
        rows.append({"from_s": at, **row})
        print(row)
    whole = {name: round(r.rate(start + 3, start + args.seconds - 1)) for name, r in results.items()}
    save(
        args.name,
        {
            "quota": args.quota,
            "seconds": args.seconds,
            "window": args.window,
            "whole_run": whole,
            "hog_error": round(whole["hog"] / args.quota - 1, 4),
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
