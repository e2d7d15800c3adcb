"""The table (each peer's ratio to the Sluice configuration of its durability class) and
docs/benchmarks.md, generated from the JSON a run wrote."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

HEADER = (
    "| configuration | durability | status | produce rec/s (median, min-max) | consume rec/s | "
    "e2e p50 / p99 / p99.9 ms at {rate:,}/s | publish-ack p50 / p99 ms | peak RSS MB | "
    "CPU µs/record: producer / consumer / servers |\n|" + " --- |" * 9
)


def _rate(summary: dict[str, float]) -> str:
    if not summary["median"]:
        return "-"
    return f"{summary['median']:,.0f} ({summary['min']:,.0f}-{summary['max']:,.0f})"


def _cpu(s: dict[str, Any]) -> str:
    ok = [r for r in s["throughput"] if r["status"] == "OK"]
    if not ok:
        return "-"
    run = sorted(ok, key=lambda r: r["consume_rps"])[len(ok) // 2]
    per = {k: v / run["records"] * 1e6 for k, v in run["cpu_s"].items()}
    return f"{per['producer']:.0f} / {per['consumer']:.0f} / {per['servers']:.0f}"


def _ms(q: dict[str, float], keys: tuple[str, ...] = ("p50", "p99", "p999")) -> str:
    return " / ".join(f"{q[k]:.2f}" for k in keys) if q else "-"


def _status(s: dict[str, Any]) -> str:
    if not s["failed"]:
        return "OK"
    reasons = s["errors"] + [
        r["reason"] for r in (*s["throughput"], s["latency"], *s["curve"]) if r.get("reason")
    ]
    return "**FAILED**: " + "; ".join(reasons)[:200].replace("|", "/").replace("\n", " ")


def table(data: dict[str, Any]) -> str:
    rows = [HEADER.format(rate=data["plan"]["latency_rate"])]
    for s in data["systems"]:
        lat = s["latency"]
        rows.append(
            f"| {s['label']} | {s['durability']} | {_status(s)} | {_rate(s['produce_rps'])} | "
            f"{_rate(s['consume_rps'])} | {_ms(lat.get('e2e_ms', {}))} | "
            f"{_ms(lat.get('ack_ms', {}), ('p50', 'p99'))} | {s['peak_rss_mb']:.0f} | {_cpu(s)} |"
        )
    return "\n".join(rows) + "\n\n" + ratios(data)


def _ratio(peer: float, sluice: float) -> str:
    return f"{peer / sluice:.2f}x" if peer and sluice else "-"


def ratios(data: dict[str, Any]) -> str:
    """Each peer's figure divided by its paired Sluice configuration's (same run, same machine)."""
    by_name = {s["name"]: s for s in data["systems"]}
    rows = [
        "| peer | against Sluice | produce | consume | e2e p99 at fixed rate | peak RSS |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in data["systems"]:
        ref = by_name.get(s["pair"])
        if s["sluice"] or ref is None:
            continue
        if s["failed"] or ref["failed"]:
            rows.append(f"| {s['label']} | {ref['label']} | FAILED run, no ratio | | | |")
            continue
        p99 = s["latency"].get("e2e_ms", {}).get("p99", 0.0), ref["latency"].get("e2e_ms", {}).get("p99", 0.0)
        rows.append(
            f"| {s['label']} [{s['durability']}] | {ref['label']} [{ref['durability']}] | "
            f"{_ratio(s['produce_rps']['median'], ref['produce_rps']['median'])} | "
            f"{_ratio(s['consume_rps']['median'], ref['consume_rps']['median'])} | {_ratio(*p99)} | "
            f"{_ratio(s['peak_rss_mb'], ref['peak_rss_mb'])} |"
        )
    note = (
        "Ratios are the peer's figure divided by Sluice's: below 1x for a rate, or above 1x for a "
        "latency or memory, Sluice is ahead."
    )
    return "\n".join(rows) + "\n\n" + note + "\n"


def curve_table(data: dict[str, Any]) -> str:
    rates = sorted({r["target_rate"] for s in data["systems"] for r in s["curve"]})
    head = "| configuration | " + " | ".join(f"{r:,}/s: achieved, p50 / p99 ms" for r in rates) + " |"
    rows = [head, "|" + " --- |" * (len(rates) + 1)]
    for s in data["systems"]:
        cells = []
        for rate in rates:
            run = next((r for r in s["curve"] if r["target_rate"] == rate), None)
            if run is None or run["status"] != "OK":
                cells.append("FAILED" if run else "-")
            else:
                e2e = run["e2e_ms"]
                cells.append(f"{run['produce_rps']:,}/s, {e2e['p50']:.2f} / {e2e['p99']:.2f}")
        rows.append(f"| {s['label']} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def _loads(m: dict[str, Any]) -> str:
    """The load averages at the run's start and, where recorded, at its end."""
    said = f"load average at the start: {', '.join(map(str, m['load_average_at_start']))}"
    if "load_average_at_end" in m:
        said += f", at the end: {', '.join(map(str, m['load_average_at_end']))}"
    return said


def _busiest(m: dict[str, Any]) -> float:
    return float(max(m["load_average_at_start"] + m.get("load_average_at_end", [])))


def document(data: dict[str, Any], main_table: str, figures: dict[str, Path], docs: Path) -> str:
    plan, m = data["plan"], data["machine"]
    rel = {k: os.path.relpath(p, docs) for k, p in figures.items()}
    quick = (
        "> **Preliminary: a QUICK run** (`make compare QUICK=1`: "
        f"{plan['records']:,} records, {plan['reps']} repetition, short paced runs) **on a machine shared "
        "with other work** ("
        f"{_loads(m)}). The figures show the harness works end to end; "
        "they are not the comparison. The full run (`make compare`) on a quiet machine replaces this "
        "page.\n\n"
        if plan["quick"] else ""
    )  # fmt: skip
    if not plan["quick"] and _busiest(m) >= m["cores"]:
        # A run beside other work still compares the systems (they share the same load, in turn), but its
        # absolute tails say more about the machine than about any of them: say so where it is read.
        quick = (
            f"> **Measured on a busy machine** ({_loads(m)} on {m['cores']} cores: "
            "other work was running). "
            "Every system ran under the same load in turn, so rates and ratios within this run compare; "
            "absolute p99/p99.9 figures are inflated by the load (Redis's p99 here is far above its sub-ms "
            "quiet-machine figure). Re-run `make compare` on a quiet machine for the published figures.\n\n"
        )
    versions = "\n".join(f"- {s['label']}: {s['version'] or 'did not start'}" for s in data["systems"])
    clients = ", ".join(f"{k} {v}" for k, v in data["clients"].items())
    memory = "\n".join(
        f"- {s['label']}: " + ", ".join(f"{k} {v} MB" for k, v in sorted(s["rss_by_process"].items()))
        for s in data["systems"]
    )
    source = data.get("json", "docs/benchmarks/compare.json")
    return f"""# Benchmarks: Sluice beside Redis Streams, NATS JetStream and RabbitMQ

<!-- Generated by `make compare` (bench/compare/report.py) from {source}: do not edit by hand. -->

{quick}Date: {data["date"]} (took {data["seconds"]} s). Machine: {m["cores"]} cores ({m["cpu"]}),
{m["memory_gb"]} GB, Linux {m["kernel"]}, Python {m["python"]}. Command:

```sh
{data["command"]}
```

Workload: {plan["records"]:,} records of a 16-byte key and a 100-byte value per run{_cap(plan)}, one
producer process and one consumer process **at the same time**, {plan["reps"]} repetition(s) (median,
min-max); then end-to-end
latency at a fixed {plan["latency_rate"]:,} records/s for {plan["latency_seconds"]:g} s, and at
{", ".join(f"{r:,}" for r in plan["curve_rates"])} records/s for {plan["curve_seconds"]:g} s each (each paced
run sends {plan["warmup_seconds"]:g} s first that is checked but not timed). Every run is checked: the
consumer counts every key; a run that lost, duplicated or garbled a record is **FAILED**, never a figure.
Each system runs on servers of its own started by the harness (loopback ports 27000-27999), stopped by PID.

## Results

{main_table}
CPU is per record of the median throughput run: the producer and consumer processes' own CPU from their
first record on (not their imports and connecting), and the servers' (every process of the system) while
the run lasted.

![throughput]({rel["throughput"]})

![latency CDF]({rel["latency_cdf"]})

![latency versus throughput]({rel["latency_curve"]})

![memory]({rel["memory"]})

### Latency versus throughput

{curve_table(data)}
## Durability: what each figure's acknowledgement means

Figures are only compared within a durability class: Sluice `flush=interval` (an acknowledged record is in
the page cache of every in-sync replica, fsynced at the next interval) sits next to Redis AOF `everysec`,
NATS JetStream's default file store and RabbitMQ's stream queue, none of which fsync before the ack; Sluice
`flush=always` (fsync before the ack) sits next to RabbitMQ's classic queue with persistent messages and
publisher confirms (a confirm follows the fsync). Redis without persistence keeps nothing over a restart.
Sluice's own Redis (offsets, metadata) runs as `sluice up` runs it: AOF with `appendfsync always`.

## How each system is driven

- **Redis Streams** (redis-py, hiredis): pipelined `XADD` in batches of 1,000; one consumer group,
  `XREADGROUP COUNT 1000 BLOCK 200` and one `XACK` per answer.
- **NATS JetStream** (nats-py): `publish_async`, acks awaited in windows of 1,000; a durable pull consumer
  (ack policy `all`) fetching 1,000 at a time and acknowledging each batch by its last message.
- **RabbitMQ** (aio-pika, AMQP 0-9-1): publisher confirms awaited in windows of 1,000, persistent messages; a
  durable classic queue, and a stream queue (read over AMQP from offset `first`); consumers with prefetch
  1,000 acknowledging with `multiple` every 500 messages and at the end of each burst.
- **Sluice** (its SDK): the producer with the SDK's defaults (acks=all, idempotent; linger 0 in the paced
  runs, as `bench/e2e_latency.py`), sending each batch with `send_many`; a pull consumer group
  (`poll_columns`, up to 1,000 records a poll, auto-commit) over 4 partitions and over
  1, under `flush=interval` and `flush=always`; a Shared push subscription acknowledging every message; and
  3 brokers, replication factor 3, acks=all (`sluice up --brokers 3`).

Publish-ack latency is the time from handing a batch (or, paced, the few records due) to the client to its
acknowledgement. End-to-end latency: the producer stamps each value with CLOCK_MONOTONIC when it hands it to
the client; the consumer process reads the same clock when the record arrives.

## Choices, and what they leave out

- One producer and one consumer process per system, each a separate Python interpreter: what one Python
  client process achieves against each server, not what each server can take from many clients. The servers
  run natively (Redis, NATS in Go, RabbitMQ on Erlang), Sluice's services in Python.
- Every peer is driven with its own recommended batching from Python; none is tuned beyond what its client
  documents. RabbitMQ goes through aiormq, the AMQP layer of aio-pika: aio-pika's message objects cost a
  third of the publish rate on this machine. The stream queue is read over AMQP 0-9-1 (offset `first`), not
  through the native stream protocol (rstream): the native client would be faster. Sluice's pull adapter
  uses its SDK's bulk calls (`send_many` per batch, as Redis's pipelines `XADD`; `poll_columns`, as
  `XREADGROUP` hands over a batch); its push adapter receives in batches and acks every message.
- The harness's own work per record is the same for every system and done batch-wise where a client hands
  over batches (`Sink.add_many`: the key, duplicate and latency checks over a whole batch by C-level
  passes, falling back to record by record for anything unusual, so a lost or repeated record still fails
  the run).
- Sluice's memory is `sluice up`'s process, which runs every service (coordinator, broker(s), offset store,
  dispatcher, delayed-delivery scheduler: its default combined mode, docs/cli.md), plus its Redis.
- A paced run that a system cannot keep up with stops sending at twice its planned length: its curve point
  shows the rate it achieved, and its latency is that of a backlog.
- A run's consumer stops when every key came and nothing else arrived for 0.3 s (a late duplicate shows up
  there), or 3 s after the producer finished with keys still missing (then the run is FAILED).

## Versions

{versions}

Python clients: {clients}.

## Memory by process (peak RSS)

{memory}

## Tail latency

Where Sluice's tail latency goes and what was done about it: [latency.md](latency.md).
"""


def _cap(plan: dict[str, Any]) -> str:
    """The throughput runs' time cap, where the plan has one (JSON files from before it have none)."""
    seconds = plan.get("throughput_seconds", 0)
    if not seconds:
        return ""
    return (
        f" (or what the producer hands out in its first {seconds:g} s, when a system is slower than that: "
        "the run is then checked on the records it sent, listed per run in compare.json)"
    )
