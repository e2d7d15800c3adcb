"""What a reassignment costs the clients, and what the throttle buys (docs/replication.md, "Reassignment").

Four local brokers, a coordinator and a private Redis as real processes. A factor-3 topic ``big`` gets a
backlog (``--mb`` of 4 KB records); a factor-3 topic ``live`` takes acks=all produce at a fixed rate from
another process for the whole run, which records each send's latency. Then ``big`` is moved to broker 3 and
back, unthrottled and at ``--throttle`` bytes/s, alternately, ``--rounds`` times: each move's duration and
the live producer's p50/p99 during it (and while idle before the moves) are reported.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from _stack import ROOT, save

sys.path.insert(0, str(ROOT))
from tests.harness import ServiceProcess, run_redis, start_service

BROKERS = 4
RECORD = bytes(4000)


@contextlib.contextmanager
def cluster() -> Iterator[str]:
    with (
        run_redis(appendonly=False) as redis,
        tempfile.TemporaryDirectory(prefix="sluice-bench-reassign-") as d,
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
            started(
                start_service(
                    "broker", "--port", "0", "--metrics-port", "0", "--broker-id", str(b),
                    "--data-dir", str(Path(d) / f"b{b}"), "--coordinator", coord.address,
                )
            )  # fmt: skip
        yield coord.address


def live_producer(bootstrap: str, rate: int, stop: Event, out: Queue[Any]) -> None:
    """acks=all sends at ``rate``/s; puts (send time, latency s) pairs when stopped."""
    from sluice import Client

    samples: list[tuple[float, float]] = []

    def record(sent: float) -> Callable[[Any], None]:
        return lambda _future: samples.append((sent, time.perf_counter() - sent))

    with Client(bootstrap) as client, client.producer("live", linger=0) as producer:
        period = 1.0 / rate
        nxt = time.perf_counter()
        while not stop.is_set() and len(samples) < 10_000_000:
            sent = time.perf_counter()
            producer.send(b"x" * 100).add_done_callback(record(sent))
            nxt += period
            time.sleep(max(0.0, nxt - time.perf_counter()))
        producer.flush()
    out.put(samples)


def move(client: Any, target: list[int], throttle: int) -> tuple[float, float, float]:
    """Reassign big/0 to ``target``; (start, end, seconds) once it completed."""
    start = time.perf_counter()
    client.admin.reassign_partitions({("big", 0): target}, throttle_bytes_per_second=throttle)
    deadline = start + 600
    while time.perf_counter() < deadline:
        part = client.admin.describe_topic("big").partitions[0]
        if not part.adding_replicas and not part.removing_replicas:
            break
        time.sleep(0.05)
    end = time.perf_counter()
    return start, end, end - start


def percentiles(latencies: list[float]) -> dict[str, float]:
    if len(latencies) < 2:
        return {"n": len(latencies)}
    q = statistics.quantiles(latencies, n=100)
    return {"n": len(latencies), "p50_ms": round(q[49] * 1000, 2), "p99_ms": round(q[98] * 1000, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=40, help="backlog of the moved partition, MB")
    parser.add_argument("--throttle", type=int, default=10_000_000, help="bytes/s of the throttled moves")
    parser.add_argument("--rate", type=int, default=500, help="live acks=all records/s")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from sluice import Client

    with cluster() as bootstrap, Client(bootstrap) as client:
        deadline = time.monotonic() + 30
        while len([b for b in client.metadata(refresh=True).brokers.values() if b.alive]) < BROKERS:
            if time.monotonic() > deadline:
                raise SystemExit("brokers did not register")
            time.sleep(0.2)
        client.admin.create_topic("big", 1, replication_factor=3)
        client.admin.create_topic("live", 1, replication_factor=3)
        with client.producer("big") as producer:
            for _ in range(args.mb * 1_000_000 // len(RECORD)):
                producer.send(RECORD)
        original = list(client.admin.describe_topic("big").partitions[0].replicas)
        spare = next(b for b in range(BROKERS) if b not in original)
        moved = [*original[:2], spare]

        ctx = mp.get_context("spawn")
        stop, out = ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=live_producer, args=(bootstrap, args.rate, stop, out))
        proc.start()
        time.sleep(5)
        idle_window = (time.perf_counter() - 3, time.perf_counter())
        windows: dict[str, list[tuple[float, float]]] = {"unthrottled": [], "throttled": []}
        durations: dict[str, list[float]] = {"unthrottled": [], "throttled": []}
        there = False
        for _ in range(args.rounds):
            for name, throttle in (("unthrottled", 0), ("throttled", args.throttle)):
                start, end, took = move(client, original if there else moved, throttle)
                there = not there
                windows[name].append((start, end))
                durations[name].append(round(took, 2))
                print(name, f"{took:.2f}s", flush=True)
                time.sleep(1)
        stop.set()
        samples = out.get(timeout=120)
        proc.join(30)

    def within(spans: list[tuple[float, float]]) -> list[float]:
        return [lat for sent, lat in samples if any(a <= sent <= b for a, b in spans)]

    save(
        "reassign",
        {
            "backlog_mb": args.mb,
            "throttle_bytes_per_second": args.throttle,
            "live_rate": args.rate,
            "move_seconds": durations,
            "live_produce_idle": percentiles(within([idle_window])),
            "live_produce_during_unthrottled": percentiles(within(windows["unthrottled"])),
            "live_produce_during_throttled": percentiles(within(windows["throttled"])),
        },
    )


if __name__ == "__main__":
    main()
