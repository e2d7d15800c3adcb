"""Issue 19's push figure, old tree against new, interleaved: ``python -m compare``'s "Sluice push,
Shared" configuration (one producer and one consumer process at the same time) run alternately on
two trees' services and SDK, under this tree's harness and adapter, so only the Sluice code differs.

    .venv/bin/python bench/push_compare_ab.py --old /work/main --new . --runs 4 --records 300000

Per run: consumed records/s, CPU per record (producer, consumer, servers), the end-to-end latency at
2,000 records/s (p50/p99/p99.9) and the load average before the run. Medians and every run are
written to ``bench/results/push-compare-ab.json``; the compare JSONs go to a temporary directory
(never to either tree's docs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEM = "sluice-push-shared"


def run_once(tree: Path, records: int, latency_seconds: float, out: Path) -> dict[str, float]:
    load = os.getloadavg()[0]
    env = dict(os.environ, COMPARE_SLUICE_TREE=str(tree), PYTHONPATH=str(tree / "services"))
    argv = [
        sys.executable, "-m", "compare", "--systems", SYSTEM, "--records", str(records), "--reps", "1",
        "--latency-seconds", str(latency_seconds), "--curve-rates", "--json", str(out / "c.json"),
        "--docs", str(out / "docs"),
    ]  # fmt: skip
    subprocess.run(argv, cwd=HERE, env=env, check=False, timeout=1200, stdout=subprocess.DEVNULL)
    system = json.loads((out / "c.json").read_text())["systems"][0]
    run, lat = system["throughput"][0], system["latency"]
    if run["status"] != "OK" or lat.get("status") != "OK":
        raise SystemExit(f"{tree}: run failed: {run.get('reason')} / {lat.get('reason')}")
    n = run["records"]
    cpu = run["cpu_s"]
    e2e = lat["e2e_ms"]
    return {
        "consume_rps": run["consume_rps"],
        "produce_rps": run["produce_rps"],
        "cpu_us_per_record.consumer": cpu["consumer"] / n * 1e6,
        "cpu_us_per_record.servers": cpu["servers"] / n * 1e6,
        "cpu_us_per_record.producer": cpu["producer"] / n * 1e6,
        "e2e_ms_at_2000.p50": e2e["p50"],
        "e2e_ms_at_2000.p99": e2e["p99"],
        "e2e_ms_at_2000.p999": e2e["p999"],
        "peak_rss_mb.all_sluice": system["peak_rss_mb"],
        "load_before": round(load, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    opts = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(opts.runs):
            for label in ("old", "new"):
                tree = (opts.old if label == "old" else opts.new).resolve()
                got = run_once(tree, opts.records, opts.latency_seconds, Path(tmp))
                runs[label].append(got)
                print(f"run {i + 1}/{opts.runs} {label}: {got}", file=sys.stderr, flush=True)
    table: dict[str, Any] = {}
    print(f"{'figure':32} {'old (median, min-max)':>30} {'new (median, min-max)':>30}")
    for key in runs["old"][0]:
        cells = []
        for label in ("old", "new"):
            values = [r[key] for r in runs[label]]
            table.setdefault(key, {})[label] = {"median": statistics.median(values), "all": values}
            cells.append(f"{statistics.median(values):.4g} ({min(values):.4g}-{max(values):.4g})")
        print(f"{key:32} {cells[0]:>30} {cells[1]:>30}")
    out = HERE / "results" / "push-compare-ab.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"old": str(opts.old), "new": str(opts.new), "records": opts.records,
                               "figures": table, "runs": runs}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
