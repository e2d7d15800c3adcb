"""Run one benchmark from two source trees, interleaved, and print the medians side by side.

    .venv/bin/python bench/ab.py --old /tmp/old-tree --new . --runs 5 -- log_throughput.py --records 300000

Interleaving (old, new, old, new, ...) is what makes an A/B figure mean something on a shared machine
whose speed drifts within the hour (README: calibration): both trees see the same drift. Each run is
the tree's own ``bench/<script>`` with that tree's ``services`` on the path, so the services it starts
are that tree's too (tests/harness.py puts its own ``services`` first). The result is the JSON the
script saved in ``<tree>/bench/results``; every numeric leaf is compared, and the table plus the raw
runs are written to ``bench/results/ab-<script>.json`` of the tree this file is in.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def numeric_leaves(data: Any, prefix: str = "") -> dict[str, float]:
    """Flatten a result into ``a.b.c -> number`` (bools and strings skipped)."""
    out: dict[str, float] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(numeric_leaves(value, f"{prefix}{key}."))
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        out[prefix.rstrip(".")] = float(data)
    return out


def run_once(tree: Path, script: str, args: list[str], timeout: float) -> dict[str, float]:
    results = tree / "bench" / "results"
    started = time.time()
    env = dict(os.environ, PYTHONPATH=str(tree / "services"))
    subprocess.run(
        [sys.executable, str(tree / "bench" / script), *args],
        cwd=tree,
        env=env,
        check=True,
        timeout=timeout,
        stdout=subprocess.DEVNULL,
    )
    fresh = [
        p for p in results.glob("*.json") if p.stat().st_mtime >= started and not p.name.startswith("ab-")
    ]
    if len(fresh) != 1:
        raise SystemExit(f"{tree}: expected one fresh result in {results}, found {[p.name for p in fresh]}")
    leaves: dict[str, float] = numeric_leaves(json.loads(fresh[0].read_text()))
    return leaves


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("script", help="a file name under bench/ of both trees")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    args = [a for a in opts.args if a != "--"]
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for i in range(opts.runs):
        for label in ("old", "new"):
            tree = opts.old if label == "old" else opts.new
            runs[label].append(run_once(tree.resolve(), opts.script, args, opts.timeout))
            print(f"run {i + 1}/{opts.runs} {label} done", file=sys.stderr)
    keys = sorted(set(runs["old"][0]) & set(runs["new"][0]))
    table = {}
    print(f"{'figure':60} {'old':>14} {'new':>14} {'change':>8}")
    for key in keys:
        old = statistics.median(r[key] for r in runs["old"] if key in r)
        new = statistics.median(r[key] for r in runs["new"] if key in r)
        change = (new - old) / old * 100 if old else 0.0
        table[key] = {"old": old, "new": new, "change_pct": round(change, 1)}
        print(f"{key:60} {old:14.4g} {new:14.4g} {change:+7.1f}%")
    out = HERE / "bench" / "results" / f"ab-{Path(opts.script).stem}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"old": str(opts.old), "new": str(opts.new), "medians": table, "runs": runs}, indent=2)
    )


if __name__ == "__main__":
    main()
