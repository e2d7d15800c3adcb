"""Produce and fetch throughput over a 4-partition topic.

Three phases on one stack: produce alone, fetch alone (from the backlog), then
a producer and a fetching consumer at once, each in its own process so the
figures are what one Python client process achieves. Beside the records/s, the CPU
per record of each client process and of the broker (over the phase, its idle
moments included): steadier than records/s on a shared machine.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from typing import Any

from _stack import cpu_seconds, produce_keyed, save, stack


def produce(bootstrap: str, topic: str, n: int, out: Queue[Any]) -> None:
    import sluice  # noqa: F401  # imported before the CPU is counted, as fetch() does

    cpu = time.process_time()
    elapsed = produce_keyed(bootstrap, topic, n)
    out.put(("produce", n, elapsed, time.process_time() - cpu))


def fetch(bootstrap: str, topic: str, n: int, partitions: int, out: Queue[Any]) -> None:
    from sluice import Client

    cpu = time.process_time()
    with Client(bootstrap) as client:
        starts = client.list_offsets(topic, "earliest")
        fetcher = client.fetcher({(topic, p): starts[p] for p in range(partitions)}, max_wait_ms=100)
        got = 0
        started = time.perf_counter()
        while got < n:
            got += len(fetcher.fetch())
        elapsed = time.perf_counter() - started
        fetcher.close()
    out.put(("fetch", got, elapsed, time.process_time() - cpu))


def run_phase(
    targets: list[tuple[Callable[..., None], tuple[object, ...]]], broker_pid: int
) -> dict[str, float]:
    """records/s of each kind of process, its CPU µs per record, and the broker's CPU µs per record."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=t, args=(*a, out)) for t, a in targets]
    broker_cpu = cpu_seconds(broker_pid)
    for p in procs:
        p.start()
    results: dict[str, float] = {}
    records = 0
    for _ in procs:
        kind, count, elapsed, cpu = out.get(timeout=900)
        results[kind] = round(count / elapsed)
        results[f"{kind}_cpu_us"] = round(cpu / count * 1e6, 2)
        records = max(records, count)
    results["broker_cpu_us"] = round((cpu_seconds(broker_pid) - broker_cpu) / records * 1e6, 2)
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
        pid = s.broker.process.pid
        produce_alone = run_phase([(produce, (s.bootstrap, "bench", n))], pid)
        fetch_alone = run_phase([(fetch, (s.bootstrap, "bench", n, parts))], pid)
        both = run_phase(
            [(produce, (s.bootstrap, "bench-mixed", n)), (fetch, (s.bootstrap, "bench-mixed", n, parts))],
            pid,
        )
    save(
        f"log_throughput_{args.flush}{'_tls' if args.tls else ''}{'_auth' if args.auth else ''}",
        {
            "records": n,
            "tls": args.tls,
            "auth": args.auth,
            "partitions": parts,
            "flush": args.flush,
            "produce_alone_rps": produce_alone["produce"],
            "fetch_alone_rps": fetch_alone["fetch"],
            "concurrent_produce_rps": both["produce"],
            "concurrent_fetch_rps": both["fetch"],
            # CPU µs per record: the client process's own, and the broker's over the phase (in the
            # concurrent phase, per record produced and fetched once).
            "produce_alone_producer_cpu_us": produce_alone["produce_cpu_us"],
            "produce_alone_broker_cpu_us": produce_alone["broker_cpu_us"],
            "fetch_alone_fetcher_cpu_us": fetch_alone["fetch_cpu_us"],
            "fetch_alone_broker_cpu_us": fetch_alone["broker_cpu_us"],
            "concurrent_producer_cpu_us": both["produce_cpu_us"],
            "concurrent_fetcher_cpu_us": both["fetch_cpu_us"],
            "concurrent_broker_cpu_us": both["broker_cpu_us"],
        },
    )


if __name__ == "__main__":
    main()
