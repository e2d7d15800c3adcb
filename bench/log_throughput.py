"""Produce and fetch throughput over a 4-partition topic.

Three phases on one stack: produce alone, fetch alone (from the backlog), then
a producer and a fetching consumer at once, each in its own process so the
figures are what one Python client process achieves.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from typing import Any

from _stack import produce_keyed, save, stack


def produce(bootstrap: str, topic: str, n: int, out: Queue[Any]) -> None:
    out.put(("produce", n, produce_keyed(bootstrap, topic, n)))


def fetch(bootstrap: str, topic: str, n: int, partitions: int, out: Queue[Any]) -> None:
    from sluice import Client

    with Client(bootstrap) as client:
        starts = client.list_offsets(topic, "earliest")
        fetcher = client.fetcher({(topic, p): starts[p] for p in range(partitions)}, max_wait_ms=100)
        got = 0
        started = time.perf_counter()
        while got < n:
            got += len(fetcher.fetch())
        elapsed = time.perf_counter() - started
        fetcher.close()
    out.put(("fetch", got, elapsed))


def run_phase(targets: list[tuple[Callable[..., None], tuple[object, ...]]]) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=t, args=(*a, out)) for t, a in targets]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        kind, count, elapsed = out.get(timeout=900)
        results[kind] = round(count / elapsed)
    for p in procs:
        p.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--flush", choices=["interval", "always", "never"], default="interval")
    parser.add_argument("--tls", action="store_true", help="TLS on every port and every client connection")
    parser.add_argument(
        "--auth", action="store_true", help="authentication and ACL authorization on, clients with a JWT"
    )
    args = parser.parse_args()
    n, parts = args.records, args.partitions
    with stack(flush=args.flush, tls=args.tls, auth=args.auth) as s:
        from sluice import Client

        with Client(s.bootstrap) as client:
            client.admin.create_topic("bench", partitions=parts)
            client.admin.create_topic("bench-mixed", partitions=parts)
        produce_alone = run_phase([(produce, (s.bootstrap, "bench", n))])["produce"]
        fetch_alone = run_phase([(fetch, (s.bootstrap, "bench", n, parts))])["fetch"]
        both = run_phase(
            [(produce, (s.bootstrap, "bench-mixed", n)), (fetch, (s.bootstrap, "bench-mixed", n, parts))]
        )
    save(
        f"log_throughput_{args.flush}{'_tls' if args.tls else ''}{'_auth' if args.auth else ''}",
        {
            "records": n,
            "tls": args.tls,
            "auth": args.auth,
            "partitions": parts,
            "flush": args.flush,
            "produce_alone_rps": produce_alone,
            "fetch_alone_rps": fetch_alone,
            "concurrent_produce_rps": both["produce"],
            "concurrent_fetch_rps": both["fetch"],
        },
    )


if __name__ == "__main__":
    main()
