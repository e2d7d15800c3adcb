"""End-to-end latency (send -> fetched by a long-polling consumer) at a fixed rate.

The producer and the consumer are separate processes, as they are in practice, so
neither's threads compete with the other's for one interpreter. Both read the
same system-wide monotonic clock (CLOCK_MONOTONIC), so a timestamp written by the
producer is comparable where the consumer reads it.

The first second (``--warmup``) is sent at the same rate but not counted: it holds
the one-off costs of a new producer and consumer (connections and streams opening,
metadata, the first fetch session), which are not what a steady rate sees.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import struct
import time
import urllib.request
from collections.abc import Callable
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from _stack import cpu_seconds, save, stack
from sluice import Client
from sluice.client import stages
from sluice.codec.batch import Record

PARTITIONS = 4
# A record: the send time (perf_counter, 8 bytes), 1 if it belongs to the warm-up, padding to 100 bytes.
HEADER = struct.Struct("<dB")
PADDING = b"x" * (100 - HEADER.size)


def consume(bootstrap: str, total: int, warmup: int, ready: Event, out: Queue[Any], group: bool) -> None:
    """``group``: a group consumer's ``poll()`` (what most applications and bench/compare use), else the
    low-level fetcher's ``fetch()``."""
    latencies: list[float] = []
    fetches = 0
    with Client(bootstrap) as client:
        if group:
            consumer = client.consumer("latency-g", ["latency"], auto_offset_reset="earliest")
            deadline = time.monotonic() + 60
            while len(consumer.assignment()) < PARTITIONS and time.monotonic() < deadline:
                consumer.poll(timeout=0.1)  # joined and assigned before the first record is sent
            receive: Callable[[], list[Record]] = lambda: consumer.poll(timeout=1.0)  # noqa: E731
            done: Callable[[], None] = consumer.close
        else:
            fetcher = client.fetcher({("latency", p): 0 for p in range(PARTITIONS)}, max_wait_ms=500)
            receive, done = fetcher.fetch, fetcher.close
        ready.set()
        seen = 0
        cpu = 0.0
        switches = 0
        while seen < total:
            if seen >= warmup and not cpu:
                cpu = time.process_time()
                switches = context_switches(os.getpid())
            fetches += 1
            for r in receive():
                seen += 1
                sent, warmup = HEADER.unpack_from(r.value)
                if not warmup:
                    latencies.append(time.perf_counter() - sent)
        cpu = time.process_time() - cpu
        switches = context_switches(os.getpid()) - switches
        done()
    out.put((latencies, fetches, cpu, stages.snapshot(), switches))


def context_switches(pid: int) -> int:
    """Voluntary and involuntary context switches of every thread of ``pid`` so far (Linux /proc)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                total += sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except FileNotFoundError:
            continue  # the thread ended meanwhile
    return total


def stage_figures(who: str, snap: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {
        f"{who}_{n}": {q: round(snap[n][f"{q}_s"] * 1000, 3) for q in ("p50", "p99", "p999")}
        | {"n": snap[n]["count"]}
        for n in names
    }


def scrape_histograms(address: str) -> dict[str, Any]:
    """The broker's stage, GC-pause and loop-lag histograms: count and p50/p99/p99.9 bucket bounds (ms)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        text = r.read().decode()
    series: dict[str, list[tuple[float, float]]] = {}
    names = "sluice_broker_stage_seconds|sluice_gc_pause_seconds|sluice_event_loop_lag_seconds"
    for name, labels, value in re.findall(rf"^({names})_bucket[{{](.*?)[}}] (\S+)$", text, re.M):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        le = float(pairs.pop("le"))
        pairs.pop("service", None)
        key = "_".join([name.removeprefix("sluice_").removesuffix("_seconds"), *pairs.values()])
        series.setdefault(key, []).append((le, float(value)))
    out: dict[str, Any] = {}
    for key, buckets in series.items():
        buckets.sort()
        total = buckets[-1][1]
        if total:
            out[key] = {"n": int(total)} | {
                q: round(next(le for le, c in buckets if c >= total * p) * 1000, 3)
                for q, p in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=int, default=2000, help="records per second")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--flush", choices=["interval", "always", "never"], default="interval")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds sent first and not counted")
    parser.add_argument(
        "--consumer",
        choices=["fetcher", "group"],
        default="fetcher",
        help="the low-level fetcher's fetch(), or a group consumer's poll() (with an offset store)",
    )
    args = parser.parse_args()
    warmup = int(args.rate * args.warmup)
    total = warmup + int(args.rate * args.seconds)
    group = args.consumer == "group"
    with stack(flush=args.flush, push=group) as s, Client(s.bootstrap) as client:
        client.admin.create_topic("latency", partitions=PARTITIONS)
        ctx = mp.get_context("spawn")
        ready, out = ctx.Event(), ctx.Queue()
        consumer = ctx.Process(target=consume, args=(s.bootstrap, total, warmup, ready, out, group))
        consumer.start()
        ready.wait(60)
        # linger 0: latency mode sends each record as soon as the sender is free.
        producer = client.producer("latency", linger=0)
        acks: list[float] = []  # send -> acknowledged, the producer's share of the latency
        broker_cpu = producer_cpu = 0.0
        broker_switches = producer_switches = 0
        interval = 1.0 / args.rate
        next_at = time.perf_counter()
        for i in range(total):
            if i == warmup:
                broker_cpu = cpu_seconds(s.broker.process.pid)
                producer_cpu = time.process_time()
                broker_switches = context_switches(s.broker.process.pid)
                producer_switches = context_switches(os.getpid())
            now = time.perf_counter()
            if now < next_at:
                time.sleep(next_at - now)
            sent = time.perf_counter()
            future = producer.send(HEADER.pack(sent, i < warmup) + PADDING)
            if i >= warmup:

                def acked(_: object, sent: float = sent) -> None:
                    acks.append(time.perf_counter() - sent)

                future.add_done_callback(acked)
            next_at += interval
        producer.flush()
        latencies, fetches, consumer_cpu, consumer_stages, consumer_switches = out.get(timeout=120)
        broker_stages = scrape_histograms(s.broker.metrics)
        broker_cpu = cpu_seconds(s.broker.process.pid) - broker_cpu
        producer_cpu = time.process_time() - producer_cpu
        broker_switches = context_switches(s.broker.process.pid) - broker_switches
        producer_switches = context_switches(os.getpid()) - producer_switches
        consumer.join(30)
        producer.close()

    def pct(values: list[float], p: float) -> float:
        ordered = sorted(values)
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000, 3)

    save(
        f"e2e_latency_{args.flush}" + ("_group" if group else ""),
        {
            "consumer": args.consumer,
            "rate": args.rate,
            "records": len(latencies),
            "warmup_records": warmup,
            "p50_ms": pct(latencies, 0.5),
            "p99_ms": pct(latencies, 0.99),
            "p999_ms": pct(latencies, 0.999),
            "max_ms": pct(latencies, 1.0),
            "ack_p50_ms": pct(acks, 0.5),
            "ack_p99_ms": pct(acks, 0.99),
            "records_per_fetch": round(total / max(fetches, 1), 2),
            # CPU per record of each process: what decides how much contention the latency sees.
            "broker_cpu_us_per_record": round(broker_cpu / max(len(latencies), 1) * 1e6, 1),
            "producer_cpu_us_per_record": round(producer_cpu / max(len(latencies), 1) * 1e6, 1),
            "consumer_cpu_us_per_record": round(consumer_cpu / max(len(latencies), 1) * 1e6, 1),
            # Context switches (every thread, voluntary + not) per record: the wake-ups a record costs,
            # a structural figure that load changes far less than the latencies.
            "broker_switches_per_record": round(broker_switches / max(len(latencies), 1), 2),
            "producer_switches_per_record": round(producer_switches / max(len(latencies), 1), 2),
            "consumer_switches_per_record": round(consumer_switches / max(len(latencies), 1), 2),
            # Where the time goes, stage by stage (docs/latency.md): bucket upper bounds in ms.
            "stages_ms": {
                **{f"broker_{k}": v for k, v in broker_stages.items()},
                **stage_figures("producer", stages.snapshot(), ("producer_queue", "producer_ack")),
                **stage_figures("consumer", consumer_stages, ("fetch_handoff", "fetch_decode")),
            },
        },
    )


if __name__ == "__main__":
    main()
