"""The cost of security: plaintext against authorization alone, TLS alone and TLS with authorization.

    .venv/bin/python bench/security_cost.py --rounds 5 --records 300000

Four configurations of the same stack (``_stack.stack``):

- ``plaintext``: no TLS, no authentication (the local default);
- ``auth``: authentication (every client a JWT) and ACL authorization (literal allows for the bench
  principal, not a super user), plaintext;
- ``tls``: TLS on every port and every client connection, no authentication;
- ``tls_auth``: both.

Workloads: ``log_throughput.py`` (produce alone, fetch alone, produce and fetch at once) and
``push_throughput.py`` (push throughput of 2 acking consumers, and end-to-end latency at a fixed rate
with every process's CPU per record). The rounds interleave the configurations (plaintext, auth, tls,
tls_auth, plaintext, ...) as ``ab.py`` does, so all four see the same drift of a shared machine. Each
figure is the median over the rounds, beside its change against plaintext. The JSON (medians, changes,
raw runs) goes to ``bench/results/security_cost.json``; a markdown table to stdout.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from _stack import ROOT, save
from ab import run_once

#: name -> the flags each workload script gets.
CONFIGS: dict[str, tuple[str, ...]] = {
    "plaintext": (),
    "auth": ("--auth",),
    "tls": ("--tls",),
    "tls_auth": ("--tls", "--auth"),
}
#: (label, script, the figure's key in the script's result, True when higher is better).
FIGURES: tuple[tuple[str, str, str, bool], ...] = (
    ("produce records/s", "log_throughput.py", "produce_alone_rps", True),
    ("fetch records/s", "log_throughput.py", "fetch_alone_rps", True),
    ("concurrent produce records/s", "log_throughput.py", "concurrent_produce_rps", True),
    ("concurrent fetch records/s", "log_throughput.py", "concurrent_fetch_rps", True),
    ("produce: producer CPU us/record", "log_throughput.py", "produce_alone_producer_cpu_us", False),
    ("produce: broker CPU us/record", "log_throughput.py", "produce_alone_broker_cpu_us", False),
    ("fetch: fetcher CPU us/record", "log_throughput.py", "fetch_alone_fetcher_cpu_us", False),
    ("fetch: broker CPU us/record", "log_throughput.py", "fetch_alone_broker_cpu_us", False),
    ("concurrent: producer CPU us/record", "log_throughput.py", "concurrent_producer_cpu_us", False),
    ("concurrent: fetcher CPU us/record", "log_throughput.py", "concurrent_fetcher_cpu_us", False),
    ("concurrent: broker CPU us/record", "log_throughput.py", "concurrent_broker_cpu_us", False),
    ("push records/s (2 consumers)", "push_throughput.py", "throughput.records_per_s", True),
    ("push: consumer CPU us/msg", "push_throughput.py", "throughput.consumer_cpu_us_per_msg", False),
    ("push: dispatcher CPU us/msg", "push_throughput.py", "throughput.dispatcher_cpu_us_per_msg", False),
    ("push latency p50 ms", "push_throughput.py", "latency.p50_ms", False),
    ("push latency p99 ms", "push_throughput.py", "latency.p99_ms", False),
    ("latency phase: broker CPU us/record", "push_throughput.py", "latency.broker_cpu_us_per_record", False),
    (
        "latency phase: dispatcher CPU us/record",
        "push_throughput.py",
        "latency.dispatcher_cpu_us_per_record",
        False,
    ),
    (
        "latency phase: producer CPU us/record",
        "push_throughput.py",
        "latency.producer_cpu_us_per_record",
        False,
    ),
    (
        "latency phase: consumer CPU us/record",
        "push_throughput.py",
        "latency.consumer_cpu_us_per_record",
        False,
    ),
    ("calibration ms", "log_throughput.py", "calibration_ms", False),
)


def workload_args(script: str, opts: argparse.Namespace) -> list[str]:
    if script == "log_throughput.py":
        return ["--records", str(opts.records)]
    return ["--records", str(opts.records), "--seconds", str(opts.latency_seconds), "--rate", str(opts.rate)]


def table(medians: dict[str, dict[str, float]], changes: dict[str, dict[str, float]]) -> str:
    names = list(CONFIGS)
    lines = [
        "| figure | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for label, _, _, _ in FIGURES:
        if label not in medians["plaintext"]:
            continue
        cells = []
        for name in names:
            value = medians[name].get(label)
            if value is None:
                cells.append("-")
                continue
            text = f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"
            change = changes[name].get(label)
            cells.append(text if name == "plaintext" or change is None else f"{text} ({change:+.1f} %)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--rate", type=int, default=2000, help="push latency phase: records/s")
    parser.add_argument("--latency-seconds", type=float, default=5.0, help="push latency phase: duration")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument(
        "--scripts", default="log_throughput.py,push_throughput.py", help="comma-separated workloads"
    )
    opts = parser.parse_args()
    scripts = [s for s in opts.scripts.split(",") if s]
    runs: dict[str, dict[str, list[dict[str, float]]]] = {s: {c: [] for c in CONFIGS} for s in scripts}
    for i in range(opts.rounds):
        for script in scripts:
            for name, flags in CONFIGS.items():
                leaves = run_once(ROOT, script, [*workload_args(script, opts), *flags], opts.timeout)
                runs[script][name].append(leaves)
                print(f"round {i + 1}/{opts.rounds} {script} {name} done", file=sys.stderr, flush=True)
    medians: dict[str, dict[str, float]] = {c: {} for c in CONFIGS}
    for label, script, key, _ in FIGURES:
        if script not in runs:
            continue
        for name in CONFIGS:
            values = [r[key] for r in runs[script][name] if key in r]
            if values:
                medians[name][label] = round(statistics.median(values), 3)
    changes: dict[str, dict[str, float]] = {c: {} for c in CONFIGS}
    for name in CONFIGS:
        for label, base in medians["plaintext"].items():
            if label in medians[name] and base:
                changes[name][label] = round((medians[name][label] - base) / base * 100, 1)
    save(
        "security_cost",
        {
            "rounds": opts.rounds,
            "records": opts.records,
            "rate": opts.rate,
            "latency_seconds": opts.latency_seconds,
            "medians": medians,
            "change_pct_vs_plaintext": changes,
            "runs": {s: {c: rs for c, rs in by.items()} for s, by in runs.items()},
        },
    )
    print(table(medians, changes))


if __name__ == "__main__":
    main()
