"""End-to-end latency (send -> fetched by a long-polling consumer) at a fixed rate.

The producer and the consumer are separate processes, as they are in practice, so
neither's threads compete with the other's for one interpreter. Both read the
same system-wide monotonic clock (CLOCK_MONOTONIC), so a timestamp written by the
producer is comparable where the consumer reads it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import struct
import time

from _stack import save, stack
from sluice import Client

PARTITIONS = 4


def consume(bootstrap: str, total: int, ready: mp.Event, out: mp.Queue) -> None:  # type: ignore[type-arg]
    latencies: list[float] = []
    with Client(bootstrap) as client:
        fetcher = client.fetcher({("latency", p): 0 for p in range(PARTITIONS)}, max_wait_ms=500)
        ready.set()
        while len(latencies) < total:
            for r in fetcher.fetch():
                (sent,) = struct.unpack_from("<d", r.value)
                latencies.append(time.perf_counter() - sent)
        fetcher.close()
    out.put(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=int, default=2000, help="records per second")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--flush", choices=["interval", "always", "never"], default="interval")
    args = parser.parse_args()
    total = int(args.rate * args.seconds)
    with stack(flush=args.flush) as s, Client(s.bootstrap) as client:
        client.admin.create_topic("latency", partitions=PARTITIONS)
        ctx = mp.get_context("spawn")
        ready, out = ctx.Event(), ctx.Queue()
        consumer = ctx.Process(target=consume, args=(s.bootstrap, total, ready, out))
        consumer.start()
        ready.wait(60)
        # linger 0: latency mode sends each record as soon as the sender is free.
        producer = client.producer("latency", linger=0)
        interval = 1.0 / args.rate
        next_at = time.perf_counter()
        for _ in range(total):
            now = time.perf_counter()
            if now < next_at:
                time.sleep(next_at - now)
            producer.send(struct.pack("<d", time.perf_counter()) + b"x" * 92)
            next_at += interval
        producer.flush()
        latencies = sorted(out.get(timeout=120))
        consumer.join(30)
        producer.close()
    ms = [x * 1000 for x in latencies]

    def pct(p: float) -> float:
        return round(ms[min(len(ms) - 1, int(len(ms) * p))], 3)

    save(
        f"e2e_latency_{args.flush}",
        {
            "rate": args.rate,
            "records": len(ms),
            "p50_ms": pct(0.5),
            "p99_ms": pct(0.99),
            "max_ms": round(ms[-1], 3),
        },
    )


if __name__ == "__main__":
    main()
