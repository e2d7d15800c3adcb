"""Delayed delivery at full size (docs/delayed-delivery.md, "Measured"): real processes.

- ``spread``: 100,000 records with random delays of 0-60 s: each delivered once, none early, lateness
  percentiles (over the records due after every send was acknowledged, and over all).
- ``rate``: 100,000 records due evenly over 10 s (10,000 due records/s), sent ahead: lateness.
- ``pending``: 10,000,000 records due 1-7 days ahead: the scheduler's and the broker's RSS once the
  scheduler has indexed them all (pending), and how long indexing took.

Lateness is the time a consumer reading the target topic receives a record minus its due time (the
``sluice-deliver-at`` header), so it includes the consumer's fetch; the consumer runs in its own process.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from _stack import ROOT, save
from sluice import Client
from sluice.client.producer.delay import DUE_HEADER

sys.path.insert(0, str(ROOT))
from tests.harness import run_redis
from tests.integration.delay.conftest import DelayCluster, start_delay_cluster

PARTITIONS = 4


def consume(bootstrap: str, topic: str, total: int, timeout: float, ready: Event, out: Queue[Any]) -> None:
    late: list[tuple[int, int]] = []
    seen: dict[bytes, int] = {}
    early = 0
    with Client(bootstrap) as client:
        fetcher = client.fetcher({(topic, p): 0 for p in range(PARTITIONS)}, max_wait_ms=100)
        ready.set()
        deadline = time.monotonic() + timeout
        while len(seen) < total and time.monotonic() < deadline:
            records = fetcher.fetch()
            now = time.time_ns() // 1_000_000
            for r in records:
                due = int(r.headers[DUE_HEADER])
                early += now < due
                late.append((due, now - due))
                seen[r.value] = seen.get(r.value, 0) + 1
        time.sleep(2.0)  # duplicates would arrive now
        for r in fetcher.fetch():
            seen[r.value] = seen.get(r.value, 0) + 1
        fetcher.close()
    out.put((late, sum(seen.values()), len(seen), early))


def scheduler_lateness(address: str) -> dict[str, Any]:
    """The scheduler's own lateness (append acknowledged minus due), from its histogram: the share of
    records within each bucket bound, and the bound the 99th percentile falls under. It leaves out the
    consumer's fetch, which on this loaded machine is often the larger part of what the reader sees."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode()
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        if family.name == "sluice_scheduler_lateness_seconds":
            buckets = [(float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")]
    total = buckets[-1][1] if buckets else 0
    p99 = next((le for le, c in buckets if total and c >= 0.99 * total), None)
    within = {f"<={int(le * 1000)}ms": round(c / total, 4) for le, c in buckets if le <= 0.25 and total}
    return {"records": int(total), "p99_at_most_ms": None if p99 is None else p99 * 1000, **within}


def _pct(values: list[int], q: float) -> int:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


def _lateness(values: list[int]) -> dict[str, int]:
    return {
        "p50": _pct(values, 0.5),
        "p99": _pct(values, 0.99),
        "p99.9": _pct(values, 0.999),
        "max": max(values),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/PID/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)


def run_timed(
    cluster: DelayCluster, name: str, delays_ms: list[int], timeout: float, absolute: bool
) -> dict[str, Any]:
    """``absolute``: each delay counts from the start of the run (``deliver_at``), not from its send."""
    load_at_start = os.getloadavg()[0]
    client = cluster.client()
    topic = cluster.topic(PARTITIONS)
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    reader = ctx.Process(
        target=consume, args=(cluster.coordinator.address, topic, len(delays_ms), timeout, ready, out)
    )
    reader.start()
    ready.wait(60)
    start = time.monotonic()
    sent_ms = time.time_ns() // 1_000_000
    with client.producer(topic, linger="5ms") as producer:
        for i, d in enumerate(delays_ms):
            key = (i % 64).to_bytes(1, "big")
            if absolute:
                when = datetime.fromtimestamp((sent_ms + d) / 1000, UTC)
                producer.send(i.to_bytes(4, "big"), key=key, deliver_at=when)
            else:
                producer.send(i.to_bytes(4, "big"), key=key, deliver_after=timedelta(milliseconds=d))
        producer.flush(120)
    acked_ms = time.time_ns() // 1_000_000
    pairs, received, distinct, early = out.get(timeout=timeout + 60)
    reader.join(30)
    late = [lt for _, lt in pairs]
    if "--by-second" in sys.argv:
        first = min(d for d, _ in pairs)
        print(f"first due at {first} (unix ms)", flush=True)  # to line seconds up with a profile
        by: dict[int, list[int]] = {}
        for due, lt in pairs:
            by.setdefault((due - first) // 1000, []).append(lt)
        for sec in sorted(by):
            lt = by[sec]
            print(f"second {sec}: {len(lt)} due, p50 {_pct(lt, 0.5)} p99 {_pct(lt, 0.99)} ms", flush=True)
    # Records due before every send was acknowledged could not all be on time: reported apart.
    timely = [lt for due, lt in pairs if due >= acked_ms]
    return {
        "case": name,
        "records": len(delays_ms),
        "send_seconds": round((acked_ms - sent_ms) / 1000, 2),
        "received": received,
        "distinct": distinct,
        "duplicates": received - distinct,
        "early": early,
        "lateness_ms_all": _lateness(late),
        "due_after_ack": len(timely),
        "lateness_ms_due_after_ack": _lateness(timely) if timely else None,
        "wall_seconds": round(time.monotonic() - start, 1),
        "scheduler_lateness": scheduler_lateness(cluster.scheduler.metrics),
        # CPU the scheduler process spent over the whole run: what a loaded machine has to find for it.
        "scheduler_cpu_seconds": cpu_seconds(cluster.scheduler.process.pid),
        "load_average": [load_at_start, os.getloadavg()[0]],
    }


def rss_kb(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS", "VmHWM")):
            k, v = line.split(":")
            out[k] = int(v.split()[0])
    return out


def run_pending(cluster: DelayCluster, total: int) -> dict[str, Any]:
    client = cluster.client()
    topic = cluster.topic(PARTITIONS, config={"retention_ms": 8 * 86_400_000})
    rng = random.Random(1)
    day = 86_400_000
    start = time.monotonic()
    with client.producer(topic, linger="20ms", batch_size=1 << 20) as producer:
        for i in range(total):
            producer.send(b"%d" % i, deliver_after=timedelta(milliseconds=day + rng.randrange(6 * day)))
        producer.flush(600)
    produced = time.monotonic() - start
    checkpoint = cluster.data_dir / "scheduler" / "checkpoint.json"
    indexed_at = None
    peak: dict[str, int] = {}
    while time.monotonic() - start < 3600:
        try:
            read = sum(json.loads(checkpoint.read_text())["read"].values())
        except (FileNotFoundError, ValueError):
            read = 0
        now = rss_kb(cluster.scheduler.process.pid)
        peak = {k: max(peak.get(k, 0), v) for k, v in now.items()}
        if read >= total:
            indexed_at = time.monotonic() - start
            break
        time.sleep(1.0)
    buckets = len(list((cluster.data_dir / "scheduler" / "buckets").glob("*.log")))
    return {
        "case": "pending",
        "records": total,
        "produce_seconds": round(produced, 1),
        "indexed_seconds": None if indexed_at is None else round(indexed_at, 1),
        "scheduler_rss_mb": round(rss_kb(cluster.scheduler.process.pid)["VmRSS"] / 1024, 1),
        "scheduler_peak_rss_mb": round(rss_kb(cluster.scheduler.process.pid)["VmHWM"] / 1024, 1),
        "broker_rss_mb": round(rss_kb(cluster.broker.process.pid)["VmRSS"] / 1024, 1),
        "broker_peak_rss_mb": round(rss_kb(cluster.broker.process.pid)["VmHWM"] / 1024, 1),
        "bucket_files": buckets,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", default=["spread", "rate", "pending"])
    p.add_argument("--records", type=int, default=100_000)
    p.add_argument("--pending", type=int, default=10_000_000)
    p.add_argument("--by-second", action="store_true", help="lateness per second of due time")
    p.add_argument(
        "--scheduler-args", nargs="*", default=[], help="more `sluice scheduler` flags (e.g. --bucket 2s)"
    )
    args = p.parse_args()
    results = []
    for case in args.cases:
        with (
            run_redis(appendonly=True) as redis,
            tempfile.TemporaryDirectory(prefix="sluice-delay-bench-") as d,
        ):
            cluster = start_delay_cluster(redis, Path(d), ("--partitions", "8", *args.scheduler_args))
            try:
                if case == "spread":
                    rng = random.Random(60)
                    delays = [rng.randrange(60_000) for _ in range(args.records)]
                    results.append(run_timed(cluster, "spread 0-60 s", delays, 180, absolute=False))
                elif case == "rate":
                    n = args.records
                    # Sent in the first seconds, due evenly over 10 s starting 15 s out: 10,000 due/s
                    # (absolute due times: the send's own duration does not stretch them).
                    delays = [15_000 + i * 10_000 // n for i in range(n)]
                    results.append(run_timed(cluster, f"{n // 10} due/s", delays, 120, absolute=True))
                else:
                    results.append(run_pending(cluster, args.pending))
            finally:
                cluster.stop()
        print(json.dumps(results[-1], indent=2), flush=True)
    save("delayed_delivery", {"results": results})


if __name__ == "__main__":
    main()
