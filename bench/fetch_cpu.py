"""CPU per fetched record: the fetching process (and its threads) and the broker.

``log_throughput``'s fetch phase lasts under a second and its records/s spread by 2x on a shared
machine; CPU time per record does not depend on what else runs nearly as much. Over one stack:
``--records`` keyed records (100 B, 4 partitions) produced once, then ``--rounds`` fetch-alone
rounds from that backlog (a fresh process each), then ``--rounds`` concurrent rounds (a producer
and a fetcher process on a fresh topic). Each round gives the fetching process's CPU per record
(split into its main thread, the part of it in ``decode_records``, and the connection's reader
thread), the broker's CPU per record over the round, records/s, and records per ``fetch()`` call;
the saved figures are medians over the rounds. Compare two trees with ``bench/ab.py`` (copy this
file into an older tree that lacks it).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.queues import Queue
from typing import Any

from _stack import cpu_seconds, produce_keyed, save, stack

PARTITIONS = 4


def _thread_cpu(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fetch(bootstrap: str, topic: str, n: int, out: Queue[Any]) -> None:
    import sluice.client.fetcher as fetcher_module
    from sluice import Client
    from sluice.codec.batch import decode_records as decode

    decode_seconds = [0.0]

    def timed_decode(*args: Any) -> Any:
        started = time.thread_time()
        try:
            return decode(*args)
        finally:
            decode_seconds[0] += time.thread_time() - started

    # The fetcher's own name for it, so fetch() calls the timed one.
    fetcher_module.__dict__["decode_records"] = timed_decode
    with Client(bootstrap) as client:
        starts = client.list_offsets(topic, "earliest")
        fetcher = client.fetcher({(topic, p): starts[p] for p in range(PARTITIONS)}, max_wait_ms=100)
        got = calls = 0
        cpu0, main0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
        while got < n:
            got += len(fetcher.fetch())
            calls += 1
        wall = time.perf_counter() - wall0
        cpu, main = time.process_time() - cpu0, time.thread_time() - main0
        # The connection's reader thread (named by client.shared_wire / client.wire), whole life.
        reader = sum(
            _thread_cpu(t.native_id)
            for t in threading.enumerate()
            if t.native_id is not None and t.name.startswith(("sluice-wire", "sluice-fetch"))
        )
        fetcher.close()
    per = 1e6 / got
    out.put(
        (
            "fetch",
            {
                "client_us": cpu * per,
                "client_main_us": main * per,
                "client_decode_us": decode_seconds[0] * per,
                "client_reader_us": reader * per,
                "rps": got / wall,
                "records_per_call": got / calls,
            },
        )
    )


def produce(bootstrap: str, topic: str, n: int, out: Queue[Any]) -> None:
    out.put(("produce", {"rps": n / produce_keyed(bootstrap, topic, n)}))


def run_round(
    targets: Sequence[tuple[Callable[..., None], tuple[object, ...]]], broker_pid: int, n: int
) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=t, args=(*a, out)) for t, a in targets]
    broker0 = cpu_seconds(broker_pid)
    for p in procs:
        p.start()
    figures: dict[str, float] = {}
    for _ in procs:
        kind, result = out.get(timeout=900)
        if kind == "produce":
            figures["produce_rps"] = result["rps"]
        else:
            figures.update(result)
    figures["broker_us"] = (cpu_seconds(broker_pid) - broker0) / n * 1e6
    for p in procs:
        p.join()
    return figures


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = args.records
    with stack() as s:
        from sluice import Client

        with Client(s.bootstrap) as client:
            client.admin.create_topic("bench", partitions=PARTITIONS)
            for r in range(args.rounds):
                client.admin.create_topic(f"bench-mixed-{r}", partitions=PARTITIONS)
        produce_keyed(s.bootstrap, "bench", n)
        pid = s.broker.process.pid
        alone = [run_round([(fetch, (s.bootstrap, "bench", n))], pid, n) for _ in range(args.rounds)]
        both: list[dict[str, float]] = []
        for r in range(args.rounds):
            topic = f"bench-mixed-{r}"
            pair = [(produce, (s.bootstrap, topic, n)), (fetch, (s.bootstrap, topic, n))]
            both.append(run_round(pair, pid, n))
    save(
        "fetch_cpu",
        {"records": n, "rounds": args.rounds, "fetch_alone": medians(alone), "concurrent": medians(both)},
    )


if __name__ == "__main__":
    main()
