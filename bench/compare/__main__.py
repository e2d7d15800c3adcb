"""``python -m compare`` (from bench/; ``make compare [QUICK=1]``): every configuration of
systems.ADAPTERS side by side; writes the JSON, the table, the four plots and docs/benchmarks.md.

Exits 1 when any run lost, duplicated or garbled a record (or a server or client failed): such a run
is reported FAILED in the table, never as a figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from compare import plots, report, runner, servers, systems

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ("redis", "hiredis", "nats-py", "aiormq", "grpcio", "matplotlib")


def plan_for(args: argparse.Namespace) -> runner.Plan:
    if args.quick:
        plan = runner.Plan(records=5_000, reps=1, latency_seconds=2.0, curve_rates=(1000, 20000),
                           curve_seconds=1.0, quick=True)  # fmt: skip
    else:
        plan = runner.Plan()
    if args.records:
        plan.records = args.records
    if args.reps:
        plan.reps = args.reps
    if args.curve_rates is not None:
        plan.curve_rates = tuple(args.curve_rates)
    if args.latency_seconds:
        plan.latency_seconds = args.latency_seconds
        plan.curve_seconds = min(plan.curve_seconds, args.latency_seconds)
    return plan


def machine(load_at_start: tuple[float, float, float]) -> dict[str, Any]:
    meminfo = Path("/proc/meminfo").read_text().split("\n")[0].split()
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.processor(),
    )  # fmt: skip
    return {
        "cores": os.cpu_count(),
        "memory_gb": round(int(meminfo[1]) / 2**20, 1),
        "cpu": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        # Both ends of the run: a quiet start says nothing of a run that other work joined halfway.
        "load_average_at_start": [round(x, 2) for x in load_at_start],
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def client_versions() -> dict[str, str]:
    found = {}
    for name in CLIENTS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compare", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a one-minute smoke: small N, 1 repetition")
    parser.add_argument("--records", type=int, default=0, help="records per throughput run")
    parser.add_argument("--reps", type=int, default=0, help="throughput repetitions")
    parser.add_argument("--latency-seconds", type=float, default=0.0, help="length of each paced run")
    parser.add_argument(
        "--systems", nargs="*", help=f"configurations to run (default: all; quick: {systems.QUICK_ADAPTERS})"
    )
    parser.add_argument(
        "--curve-rates", type=int, nargs="*", help="records/s of the latency-versus-throughput curve"
    )
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "benchmarks" / "compare.json")
    parser.add_argument(
        "--docs", type=Path, default=ROOT / "docs", help="where benchmarks.md and benchmarks/*.png go"
    )
    parser.add_argument(
        "--command", default="", help="the command to print in benchmarks.md (the Makefile's)"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="run nothing: write plots and benchmarks.md from --json"
    )
    args = parser.parse_args(argv)
    if args.report_only:
        return write_outputs(json.loads(args.json.read_text()), args.docs)
    plan = plan_for(args)
    adapters = systems.by_name(args.systems or (systems.QUICK_ADAPTERS if args.quick else None))
    started = time.time()
    load_at_start = os.getloadavg()
    ports = servers.Ports()
    results = []
    for adapter in adapters:
        print(f"== {adapter.name}: {adapter.label} [{adapter.durability}]", flush=True)
        results.append(runner.as_dict(runner.run_system(adapter, plan, ports)))
        if results[-1]["errors"]:
            print(f"   FAILED: {results[-1]['errors']}", flush=True)
    data = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "seconds": round(time.time() - started),
        "command": args.command or shlex.join([sys.executable, "-m", "compare", *(argv or sys.argv[1:])]),
        "plan": dataclasses.asdict(plan),
        "machine": machine(load_at_start),
        "clients": client_versions(),
        "systems": results,
        "json": os.path.relpath(args.json, ROOT),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=1) + "\n")
    return write_outputs(data, args.docs)


def write_outputs(data: dict[str, Any], docs: Path) -> int:
    """The plots, the table and benchmarks.md; 1 when any configuration failed."""
    figures = plots.write_all(data, docs / "benchmarks")
    table = report.table(data)
    print(table)
    (docs / "benchmarks.md").write_text(report.document(data, table, figures, docs))
    failed = [r["name"] for r in data["systems"] if r["failed"]]
    if failed:
        print(f"FAILED (lost, duplicated or garbled records, or errors): {failed}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
