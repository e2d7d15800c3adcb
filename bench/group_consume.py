"""Group consume throughput: 1,000,000 records over 4 partitions, one consumer process.

Two phases on one stack (coordinator, broker, offset store, private Redis):

* ``backlog``: the records are produced first; then one group consumer (``client.consumer``,
  background prefetch, auto-commit every 5 s) reads them all;
* ``concurrent``: a producer process writes while the consumer process reads.

Each side runs in its own process, so the figures are what one Python client process achieves.
Records are 100 B values with 16 B keys, as in ``log_throughput.py``. The consumer's rate is
measured from its first poll (after joining) to the last record.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from typing import Any

from _stack import produce_keyed, save, stack


def produce(bootstrap: str, topic: str, n: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    out.put(("produce", n, produce_keyed(bootstrap, topic, n), {}))


def consume(
    bootstrap: str,
    topic: str,
    group: str,
    n: int,
    settings: dict[str, Any],
    out: mp.Queue,  # type: ignore[type-arg]
) -> None:
    from sluice import Client

    with Client(bootstrap) as client:
        joined = time.perf_counter()
        consumer = client.consumer(group, [topic], auto_offset_reset="earliest", **settings)
        join_s = time.perf_counter() - joined
        got = 0
        poll = consumer.poll
        started = time.perf_counter()
        while got < n:
            got += len(poll(1.0))
        elapsed = time.perf_counter() - started
        consumer.close()
        committed = sum(client.admin.group_offsets(group).values())
    out.put(("consume", got, elapsed, {"join_s": round(join_s, 3), "committed": committed}))


def run_phase(targets: list[tuple[object, tuple[object, ...]]]) -> dict[str, tuple[int, dict[str, object]]]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=t, args=(*a, out)) for t, a in targets]  # type: ignore[arg-type]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        kind, count, elapsed, extra = out.get(timeout=900)
        results[kind] = (round(count / elapsed), extra)
    for p in procs:
        p.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-poll-records", type=int, default=500)
    parser.add_argument(
        "--fetch-min-bytes",
        type=int,
        default=1,
        help="consumer fetch_min_bytes (1, the default, answers as soon as anything is there)",
    )
    args = parser.parse_args()
    n, parts = args.records, args.partitions
    settings = {"max_poll_records": args.max_poll_records, "fetch_min_bytes": args.fetch_min_bytes}
    with stack(push=True) as s:
        from sluice import Client

        with Client(s.bootstrap) as client:
            client.admin.create_topic("bench", partitions=parts)
            client.admin.create_topic("bench-mixed", partitions=parts)
        run_phase([(produce, (s.bootstrap, "bench", n))])
        backlog_rps, backlog = run_phase([(consume, (s.bootstrap, "bench", "g-backlog", n, settings))])[
            "consume"
        ]
        both = run_phase(
            [
                (produce, (s.bootstrap, "bench-mixed", n)),
                (consume, (s.bootstrap, "bench-mixed", "g-mixed", n, settings)),
            ]
        )
    save(
        "group_consume",
        {
            "records": n,
            "partitions": parts,
            **settings,
            "backlog_consume_rps": backlog_rps,
            "backlog_committed": backlog["committed"],
            "join_s": backlog["join_s"],
            "concurrent_consume_rps": both["consume"][0],
            "concurrent_produce_rps": both["produce"][0],
            "concurrent_committed": both["consume"][1]["committed"],
        },
    )


if __name__ == "__main__":
    main()
