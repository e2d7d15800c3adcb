"""The dispatcher's memory budget at the issue's scale (issue 16): a Shared consumer that never acknowledges,
on a topic with 1 GiB of backlog, against the default 128 MiB budget.

Reports the dispatcher's RSS (baseline once warm, peak while the hostile consumer holds what it may, and
after churn: once it left and its subscription was unloaded), the budget's gauges, and the records/s of
polite subscriptions of the same topic alone and while the hostile consumer holds its share (best of
``--runs``). ``--no-budget`` runs the same with ``--memory-budget-bytes 0`` (the dispatcher before the
budget). The suite's version is ``tests/integration/dispatcher/test_memory_budget.py`` (16 MiB budget,
64 MiB backlog, the same checks).

    python bench/dispatcher_memory_budget.py [--backlog-mib 1024] [--record 16384] [--no-budget]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "services"))
sys.path.insert(0, str(ROOT))

from tests.integration.dispatcher.conftest import run_cluster, wait_until  # noqa: E402
from tests.integration.dispatcher.test_memory_budget import drain, polite_rate, rss, subscribe  # noqa: E402

MiB = 1 << 20
TOPIC = "budget-bench"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backlog-mib", type=int, default=1024)
    ap.add_argument("--record", type=int, default=16384, help="record size in bytes")
    ap.add_argument("--polite-mib", type=int, default=128, help="what one polite measurement reads")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-budget", action="store_true")
    ap.add_argument("--hold-seconds", type=float, default=20.0, help="how long the hostile consumer reads")
    args = ap.parse_args()
    extra = ["--idle-subscription-linger", "1s"]
    if args.no_budget:
        extra += ["--memory-budget-bytes", "0"]
    per_batch = max(1, MiB // args.record)
    records = args.backlog_mib * MiB // args.record
    polite_n = args.polite_mib * MiB // args.record
    with run_cluster(*extra) as c:
        c.create_topic(TOPIC)
        t0 = time.monotonic()
        value = b"v" * args.record
        for _ in range(records // per_batch):
            # Stamped now: the broker's age retention (7 days) would delete records stamped in 1970.
            c.produce(TOPIC, 0, [value] * per_batch, timestamp=int(time.time() * 1000))
        print(f"produced {args.backlog_mib} MiB ({records} records) in {time.monotonic() - t0:.1f} s")
        alone = [polite_rate(c, f"alone-{i}", polite_n, TOPIC) for i in range(args.runs)]
        baseline = rss(c)
        print(f"baseline RSS {baseline / MiB:.1f} MiB; polite alone {[round(r) for r in alone]} rec/s")
        hostile = subscribe(c, "hostile", 1 << 22, TOPIC)
        held = drain(hostile, records, ack=False, timeout=args.hold_seconds)
        peak = rss(c)
        used = c.metric("sluice_dispatcher_memory_budget_used_bytes")
        pauses = c.metric("sluice_dispatcher_memory_budget_read_pauses_total")
        print(
            f"hostile holds {held} records ({held * args.record / MiB:.0f} MiB of payload); budget used "
            f"{used / MiB:.1f} MiB, read pauses {pauses:.0f}; RSS {peak / MiB:.1f} MiB"
        )
        during = []
        for i in range(args.runs):
            try:
                during.append(polite_rate(c, f"with-{i}", polite_n, TOPIC))
            except AssertionError:
                print(c.describe(TOPIC, f"with-{i}"))
                text = urllib.request.urlopen(f"http://{c.dispatcher.metrics}/metrics", timeout=10).read()
                print("\n".join(x for x in text.decode().splitlines() if "memory" in x and x[0] != "#"))
                raise
            peak = max(peak, rss(c))
        hostile.close()
        peak = max(peak, rss(c))
        limit = baseline + 128 * MiB * 1.25
        print(
            f"peak RSS {peak / MiB:.1f} MiB (+{(peak - baseline) / MiB:.1f} over the baseline; "
            f"bound baseline + 128 MiB + 25% = {limit / MiB:.1f}: {'ok' if peak <= limit else 'EXCEEDED'})"
        )
        ratio = max(during) / max(alone)
        medians = statistics.median(during) / statistics.median(alone)
        print(
            f"polite with the hostile consumer {[round(r) for r in during]} rec/s: best {ratio:.0%} of alone "
            f"({'ok' if ratio >= 0.8 else 'BELOW 80%'}), median {medians:.0%}"
        )
        wait_until(lambda: c.metric("sluice_dispatcher_memory_budget_used_bytes") == 0, 60, "budget released")
        time.sleep(25)  # two malloc_trim passes
        print(f"RSS after churn {rss(c) / MiB:.1f} MiB (baseline {baseline / MiB:.1f})")


if __name__ == "__main__":
    main()
