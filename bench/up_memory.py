"""``sluice up``'s memory: RSS and PSS summed over every process it runs (the services and its redis-server;
the separate mode's launcher excluded, as docs/latency.md's "Memory" counts it), idle and under load, for
``--processes combined`` and ``--processes separate``, interleaved.

PSS (proportional set size) divides a shared page among the processes that map it, so it does not count
the interpreter's and grpc's libraries once per process as RSS does. Load: one producer process sends
``--records`` records of 100 B (16-byte keys) to a 4-partition topic while this process fetches them all;
the peak is sampled every 200 ms from /proc.

    python bench/up_memory.py --records 300000 --runs 2
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _stack import ROOT, produce_keyed, save

BOOTSTRAP = re.compile(r"^Sluice is up\. Bootstrap: (\S+)$")
PID = re.compile(r"^\s+(\S+)\s.*\bpid (\d+)")
PARTITIONS = 4


def rss_pss_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of one process in MB, from /proc/<pid>/smaps_rollup; (0, 0) once it is gone."""
    figures = {"Rss:": 0.0, "Pss:": 0.0}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name, _, rest = line.partition(" ")
            if name in figures:
                figures[name] = int(rest.split()[0]) / 1024
    except OSError:
        pass
    return figures["Rss:"], figures["Pss:"]


def summed(pids: set[int]) -> tuple[float, float]:
    pairs = [rss_pss_mb(p) for p in pids]
    return sum(r for r, _ in pairs), sum(p for _, p in pairs)


def start(mode: str, data: Path) -> tuple[subprocess.Popen[str], str, dict[str, int]]:
    argv = [sys.executable, "-m", "sluice", "up", "--port", "0", "--data-dir", str(data), "--processes", mode]
    up = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    assert up.stdout is not None
    bootstrap, pids = "", {}
    for line in up.stdout:
        if m := BOOTSTRAP.match(line.rstrip("\n")):
            bootstrap = m.group(1)
        elif bootstrap and (m := PID.match(line)):
            pids[m.group(1)] = int(m.group(2))
        elif line.startswith("Logs:"):
            break
    if not bootstrap:
        up.kill()
        raise SystemExit(f"sluice up --processes {mode} did not start")
    return up, bootstrap, pids


def load(bootstrap: str, records: int, pids: set[int]) -> tuple[float, float, float]:
    """Produce and consume ``records`` at once; (peak RSS, peak PSS, seconds)."""
    from sluice import Client

    topic = f"mem-{time.monotonic_ns()}"
    with Client(bootstrap) as client:
        client.admin.create_topic(topic, PARTITIONS)
        peaks = [0.0, 0.0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.2):
                rss, pss = summed(pids)
                peaks[0], peaks[1] = max(peaks[0], rss), max(peaks[1], pss)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        producer = multiprocessing.get_context("spawn").Process(
            target=produce_keyed, args=(bootstrap, topic, records)
        )
        producer.start()
        fetcher = client.fetcher({(topic, p): 0 for p in range(PARTITIONS)}, max_wait_ms=500)
        seen = 0
        deadline = time.monotonic() + 600
        while seen < records and time.monotonic() < deadline:
            seen += len(fetcher.fetch())
        fetcher.close()
        producer.join(600)
        elapsed = time.perf_counter() - started
        done.set()
        sampler.join()
    if seen < records:
        raise SystemExit(f"consumed {seen} of {records}")
    return peaks[0], peaks[1], elapsed


def measure(mode: str, records: int, idle_s: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="up-memory-") as tmp:
        up, bootstrap, named = start(mode, Path(tmp) / "data")
        try:
            pids = set(named.values())
            processes = len(pids)
            time.sleep(idle_s)  # the services' start-up work (first metadata rounds) settles
            idle_rss, idle_pss = summed(pids)
            peak_rss, peak_pss, seconds = load(bootstrap, records, pids)
            after_rss, after_pss = summed(pids)
        finally:
            up.terminate()
            up.wait(120)
    return {
        "processes": processes,
        "idle_rss": idle_rss,
        "idle_pss": idle_pss,
        "peak_rss": peak_rss,
        "peak_pss": peak_pss,
        "after_rss": after_rss,
        "after_pss": after_pss,
        "records_per_s": records / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--modes", nargs="+", default=["combined", "separate"])
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {m: [] for m in args.modes}
    for run in range(args.runs):
        for mode in args.modes:  # interleaved: both modes see the same machine load
            figures = measure(mode, args.records, args.idle_seconds)
            results[mode].append(figures)
            shown = ", ".join(f"{k} {v:.1f}" for k, v in figures.items())
            print(f"run {run + 1} {mode}: {shown}", flush=True)
    for mode, runs in results.items():
        medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"median {mode}: " + ", ".join(f"{k} {v:.1f}" for k, v in medians.items()))
    save("up_memory", {"records": args.records, "results": results})


if __name__ == "__main__":
    main()
