"""Replication's cost: factor 3 with acks=all against factor 1 with acks=1, in the same run.

Three local brokers, a coordinator and a private Redis, as real processes (docs/replication.md,
"Measured"). Two phases, each for both settings, interleaved (factor 1, factor 3, factor 1, ...) so the
machine's drift hits both alike:

- throughput: a producer and a fetching consumer at once, each its own process, over a 4-partition topic
  (records of 100 B), records/s of each;
- end-to-end latency at a fixed rate (default 2,000 records/s): send -> fetched by a long-polling consumer,
  p50 and p99 (the producer sends each record as soon as it can: linger 0, or ``--linger``);
- the acknowledgement alone: one-record produce requests one at a time to the leader (gRPC), p50 and p99
  of the answer, so the cost of the commit itself shows apart from queueing under load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from _stack import ROOT, cpu_seconds, save
from e2e_latency import context_switches

sys.path.insert(0, str(ROOT))
from tests.harness import ServiceProcess, run_redis, start_service

PARTITIONS = 4
BROKERS = 3
VALUE = b"x" * 100
HEADER = struct.Struct("<dB")
PADDING = b"x" * (100 - HEADER.size)
SETTINGS = {"f1_acks1": (1, 1), "f3_acksall": (3, -1)}


@contextlib.contextmanager
def cluster(flush: str, pids: list[int], metrics: list[str] | None = None) -> Iterator[str]:
    """A coordinator and three brokers; yields the bootstrap address (the brokers' pids go to ``pids``,
    their metrics addresses to ``metrics``)."""
    with (
        run_redis(appendonly=False) as redis,
        tempfile.TemporaryDirectory(prefix="sluice-bench-repl-") as d,
        contextlib.ExitStack() as running,
    ):

        def started(sp: ServiceProcess) -> ServiceProcess:
            running.callback(sp.terminate)
            return sp

        coord = started(
            start_service(
                "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url,
                "--broker-heartbeat-interval", "500ms",
            )
        )  # fmt: skip
        for b in range(BROKERS):
            broker = started(
                start_service(
                    "broker", "--port", "0", "--metrics-port", "0", "--broker-id", str(b),
                    "--data-dir", str(Path(d) / f"b{b}"), "--coordinator", coord.address, "--flush", flush,
                )
            )  # fmt: skip
            pids.append(broker.process.pid)
            if metrics is not None:
                metrics.append(broker.metrics)
        yield coord.address


def create(bootstrap: str, topic: str, factor: int) -> None:
    from sluice import Client
    from sluice.errors import InvalidReplicationFactor

    deadline = time.monotonic() + 30
    with Client(bootstrap) as client:
        while True:
            try:
                client.admin.create_topic(topic, partitions=PARTITIONS, replication_factor=factor)
                return
            except InvalidReplicationFactor:  # brokers still registering
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def producer_config(acks: int, **overrides: Any) -> Any:
    """The SDK's producer settings with ``acks`` (idempotence at its default: on)."""
    from sluice.client.producer.config import ProducerConfig

    return ProducerConfig().replace(acks=acks, **overrides)


def produce(bootstrap: str, topic: str, n: int, acks: int, out: Queue[Any]) -> None:
    from sluice import Client

    with Client(bootstrap) as client:
        producer = client.producer(topic, config=producer_config(acks))
        started = time.perf_counter()
        for i in range(n):
            producer.send(VALUE, key=str(i & 1023).encode())
        producer.flush()
        elapsed = time.perf_counter() - started
        producer.close()
    out.put(("produce", n / elapsed))


def fetch(bootstrap: str, topic: str, n: int, out: Queue[Any]) -> None:
    from sluice import Client

    with Client(bootstrap) as client:
        fetcher = client.fetcher({(topic, p): 0 for p in range(PARTITIONS)}, max_wait_ms=100)
        got = 0
        started = time.perf_counter()
        while got < n:
            got += len(fetcher.fetch())
        elapsed = time.perf_counter() - started
        fetcher.close()
    out.put(("fetch", got / elapsed))


def throughput(bootstrap: str, topic: str, n: int, acks: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=produce, args=(bootstrap, topic, n, acks, out)),
        ctx.Process(target=fetch, args=(bootstrap, topic, n, out)),
    ]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=900) for _ in procs)
    for p in procs:
        p.join(60)
    return results


#: ``REPLICATION_DUMP=dir``: each latency run's (sent, latency) pairs go to a file there, in arrival order
#: (when a tail happens: a burst, or spread out).
DUMP = os.environ.get("REPLICATION_DUMP", "")


def consume(bootstrap: str, topic: str, total: int, warmup: int, ready: Event, out: Queue[Any]) -> None:
    from sluice import Client

    latencies: list[float] = []
    stamps: list[tuple[float, float]] = []
    with Client(bootstrap) as client:
        fetcher = client.fetcher({(topic, p): 0 for p in range(PARTITIONS)}, max_wait_ms=500)
        ready.set()
        seen = 0
        while seen < total:
            for r in fetcher.fetch():
                seen += 1
                sent, in_warmup = HEADER.unpack_from(r.value)
                if not in_warmup:
                    latencies.append(time.perf_counter() - sent)
                    if DUMP:
                        stamps.append((sent, latencies[-1]))
        fetcher.close()
    if DUMP:
        Path(DUMP, f"{topic}.json").write_text(json.dumps(stamps))
    out.put(latencies)


def latency(
    bootstrap: str,
    topic: str,
    acks: int,
    rate: int,
    seconds: float,
    brokers: list[int],
    linger: str = "0ms",
    profile: Path | None = None,
) -> dict[str, float]:
    from sluice import Client

    warmup = rate
    total = warmup + int(rate * seconds)
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    consumer = ctx.Process(target=consume, args=(bootstrap, topic, total, warmup, ready, out))
    consumer.start()
    ready.wait(60)
    with Client(bootstrap) as client:
        producer = client.producer(topic, config=producer_config(acks, linger=linger))
        interval = 1.0 / rate
        next_at = time.perf_counter()
        cpu = switches = 0.0
        spies: list[subprocess.Popen[bytes]] = []
        for i in range(total):
            if i == warmup:
                cpu = sum(cpu_seconds(pid) for pid in brokers)
                switches = sum(context_switches(pid) for pid in brokers)
                if profile is not None:
                    spies = [
                        spy(pid, profile / f"{topic}-b{b}.txt", seconds) for b, pid in enumerate(brokers, 0)
                    ]
            now = time.perf_counter()
            if now < next_at:
                time.sleep(next_at - now)
            producer.send(HEADER.pack(time.perf_counter(), i < warmup) + PADDING)
            next_at += interval
        producer.flush()
        latencies: list[float] = out.get(timeout=120)
        cpu = sum(cpu_seconds(pid) for pid in brokers) - cpu
        switches = sum(context_switches(pid) for pid in brokers) - switches
        consumer.join(30)
        producer.close()
        for proc in spies:
            proc.wait(60)
    ordered = sorted(latencies)
    return {
        "p50_ms": round(ordered[len(ordered) // 2] * 1000, 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
        "p999_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.999))] * 1000, 3),
        # All three brokers (the leaders and the followers of the topic's partitions): what replication
        # costs in CPU and wake-ups, figures the machine's load moves far less than the latencies.
        "brokers_cpu_us_per_record": round(cpu / max(len(latencies), 1) * 1e6, 1),
        "brokers_switches_per_record": round(switches / max(len(latencies), 1), 2),
    }


def spy(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes]:
    """py-spy on one broker for ``seconds`` (collapsed stacks, not pausing it: --nonblocking)."""
    return subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--duration", str(max(int(seconds), 1)), "--rate", "200",
         "--nonblocking", "--format", "raw", "--output", str(out),
         *(["--native"] if os.environ.get("SPY_NATIVE") else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


#: The brokers' histograms a profiling run reads back: name -> the label that splits it.
HISTOGRAMS = {
    "sluice_broker_stage_seconds": "stage",
    "sluice_event_loop_lag_seconds": "service",
    "sluice_gc_pause_seconds": "generation",
}


def stage_quantiles(metrics: list[str]) -> dict[str, dict[str, float]]:
    """Each broker's stage, event-loop lag and GC pause histograms as p50/p99/max upper bounds (ms)."""
    import urllib.request

    out: dict[str, dict[str, float]] = {}
    for b, address in enumerate(metrics):
        text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
        buckets: dict[str, list[tuple[float, float]]] = {}
        for line in text.splitlines():
            name = line.split("_bucket{", 1)[0]
            if name not in HISTOGRAMS or "_bucket{" not in line:
                continue
            labels, value = line.rsplit(" ", 1)
            label = HISTOGRAMS[name]
            which = labels.split(f'{label}="', 1)[1].split('"', 1)[0]
            le = labels.split('le="', 1)[1].split('"', 1)[0]
            buckets.setdefault(f"{name.removeprefix('sluice_')}.{which}", []).append(
                (float(le), float(value))
            )
        for series, cumulative in buckets.items():
            cumulative.sort()
            total = cumulative[-1][1]
            if not total:
                continue
            figures = {"count": total}
            for q in (0.5, 0.99, 1.0):
                key = "max_ms" if q == 1.0 else f"p{int(q * 100)}_ms"
                figures[key] = next(le for le, c in cumulative if c >= q * total) * 1000
            out[f"b{b}.{series}"] = figures
    return out


def ack_latency(bootstrap: str, topic: str, acks: int, requests: int = 400) -> dict[str, float]:
    """One-record produces, one at a time, straight to the partition's leader."""
    import grpc

    from sluice.codec.batch import BatchBuilder
    from sluice.v1 import broker_pb2, broker_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc

    with grpc.insecure_channel(bootstrap) as channel:
        meta = coordinator_pb2_grpc.CoordinatorStub(channel).Metadata(
            coordinator_pb2.MetadataRequest(topics=[topic]), timeout=10
        )
    leader = meta.topics[0].partitions[0].broker_id
    endpoint = next(b.endpoint for b in meta.brokers if b.broker_id == leader)
    builder = BatchBuilder()
    builder.append(VALUE, None, None, None, 1_000)
    batch = builder.build()
    request = broker_pb2.ProduceRequest(
        acks=acks, partitions=[broker_pb2.ProducePartition(topic=topic, partition=0, records=batch)]
    )
    latencies = []
    with grpc.insecure_channel(f"{endpoint.host}:{endpoint.port}") as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        for i in range(requests + 50):
            started = time.perf_counter()
            answer = stub.Produce(request, timeout=10)
            if answer.partitions[0].error.code:
                raise RuntimeError(answer.partitions[0].error.message)
            if i >= 50:  # the first ones open connections and caches
                latencies.append(time.perf_counter() - started)
    ordered = sorted(latencies)
    return {
        "ack_p50_ms": round(ordered[len(ordered) // 2] * 1000, 3),
        "ack_p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000, help="per throughput run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each setting")
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--flush", choices=["interval", "always", "never"], default="interval")
    parser.add_argument("--linger", default="0ms", help="the latency phase's producer linger")
    parser.add_argument("--latency-only", action="store_true", help="skip the throughput phase")
    parser.add_argument("--only", choices=list(SETTINGS), help="run one setting only (profiling)")
    parser.add_argument(
        "--broker-nice",
        type=int,
        help="a diagnosis, not a setting: the brokers' nice value (negative: ahead of the machine's other "
        "processes), to tell scheduling delay from work on the path (root only)",
    )
    parser.add_argument(
        "--profile", type=Path, help="py-spy each broker during the latency phase (collapsed stacks here)"
    )
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    brokers: list[int] = []
    metrics: list[str] = []
    with cluster(args.flush, brokers, metrics) as bootstrap:
        if args.broker_nice is not None:
            for pid in brokers:
                os.setpriority(os.PRIO_PROCESS, pid, args.broker_nice)
        for r in range(args.rounds):
            for name, (factor, acks) in SETTINGS.items():
                if args.only and name != args.only:
                    continue
                create(bootstrap, f"tp-{name}-{r}", factor)
                create(bootstrap, f"lat-{name}-{r}", factor)
                figures: dict[str, float] = {}
                if not args.latency_only:
                    figures = throughput(bootstrap, f"tp-{name}-{r}", args.records, acks)
                figures.update(
                    latency(
                        bootstrap,
                        f"lat-{name}-{r}",
                        acks,
                        args.rate,
                        args.seconds,
                        brokers,
                        args.linger,
                        args.profile,
                    )
                )
                figures.update(ack_latency(bootstrap, f"lat-{name}-{r}", acks))
                runs[name].append(figures)
                print(name, figures, flush=True)
        stages = stage_quantiles(metrics)
    if args.only:  # a profiling run: its figures and the brokers' stage histograms, no comparison
        print(json.dumps(stages, indent=1))
        save(f"replication_{args.only}_{args.flush}", {"runs": runs[args.only], "stages": stages})
        return
    medians = {
        name: {key: round(statistics.median(run[key] for run in rs), 3) for key in rs[0]}
        for name, rs in runs.items()
    }
    f1, f3 = medians["f1_acks1"], medians["f3_acksall"]
    save(
        f"replication_{args.flush}",
        {
            "records": args.records,
            "rounds": args.rounds,
            "rate": args.rate,
            "linger": args.linger,
            "flush": args.flush,
            "medians": medians,
            **(
                {}
                if args.latency_only
                else {
                    "f3_produce_share": round(f3["produce"] / f1["produce"], 3),
                    "f3_fetch_share": round(f3["fetch"] / f1["fetch"], 3),
                }
            ),
            "f3_p99_over_f1_ms": round(f3["p99_ms"] - f1["p99_ms"], 3),
            "f3_ack_p99_over_f1_ms": round(f3["ack_p99_ms"] - f1["ack_p99_ms"], 3),
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
