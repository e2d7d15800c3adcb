"""SQL92 property filters: what a filtered fetch costs against an unfiltered fetch of the same data.

One broker (real processes, ``_stack``), one partition of ``--records`` records (100 B values) with
3 headers each: ``region`` (r0..r9, random per record), ``prio`` (0..9, random) and ``id`` (unique).
Then ``--rounds`` rounds of full fetches of the partition through the SDK's ``Fetcher`` (the records
decoded, as an application gets them), one per filter:

- ``unfiltered``;
- ``selective``: ``region = 'r3'`` (10 % of the records, spread at random over every batch, so
  pruning cannot help: the broker decodes every record's headers);
- ``nothing``: ``region = 'zz'`` (no record: every batch is pruned from its header summary);
- ``nothing_unpruned``: ``id = 'none'`` (no record, but ``id`` has too many values per batch to be in
  the bloom: the broker decodes every record; what ``nothing`` would cost without pruning).

Saved (medians over the rounds): wall seconds, broker CPU seconds and records delivered per filter,
and the two ratios the issue asks for: the selective fetch's rate of matching records over the
unfiltered fetch's record rate (target >= 0.5; in wall time, and per CPU second of broker and client
together, which a loaded shared machine disturbs far less), and the nothing-matching fetch's cost
over the unfiltered one's (target <= 0.2), in wall time and in broker CPU.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from _stack import cpu_seconds, save, stack

TOPIC = "sql-bench"
FILTERS = {
    "unfiltered": None,
    "selective": "region = 'r3'",
    "nothing": "region = 'zz'",
    "nothing_unpruned": "id = 'none'",
}


def produce(bootstrap: str, n: int, seed: int) -> None:
    from sluice import Client

    rng = random.Random(seed)
    value = b"x" * 100
    with Client(bootstrap) as client:
        client.admin.create_topic(TOPIC, partitions=1)
        with client.producer(TOPIC) as producer:
            for i in range(n):
                headers = {
                    "region": f"r{rng.randrange(10)}".encode(),
                    "prio": str(rng.randrange(10)).encode(),
                    "id": str(i).encode(),
                }
                producer.send(value, headers=headers, partition=0)
            producer.flush()


def fetch_all(bootstrap: str, n: int, sql: str | None, broker_pid: int) -> dict[str, float]:
    from sluice import Client
    from sluice.codec.filter import sql_expression

    filters = {TOPIC: sql_expression(sql)} if sql is not None else None
    with Client(bootstrap) as client:
        fetcher = client.fetcher({(TOPIC, 0): 0}, filters=filters, max_wait_ms=100)
        got = 0
        cpu0, wall0, client0 = cpu_seconds(broker_pid), time.perf_counter(), time.process_time()
        while fetcher.positions()[(TOPIC, 0)] < n:
            got += len(fetcher.fetch(0.01))
        wall = time.perf_counter() - wall0
        client_cpu = time.process_time() - client0
        cpu = cpu_seconds(broker_pid) - cpu0
        fetcher.close()
    return {
        "wall_s": wall,
        "broker_cpu_s": cpu,
        "client_cpu_s": client_cpu,
        "records": got,
        "records_per_s": got / wall,
        # Records per CPU second of broker + client together: what the rate would be on an idle
        # machine with the two pipelined, and far steadier than wall time on a shared one.
        "records_per_cpu_s": got / max(cpu + client_cpu, 1e-3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with stack() as s:
        t0 = time.perf_counter()
        produce(s.bootstrap, args.records, 17)
        produce_s = time.perf_counter() - t0
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in FILTERS}
        for _ in range(args.rounds):
            for name, sql in FILTERS.items():  # interleaved: the machine's drift hits each alike
                runs[name].append(fetch_all(s.bootstrap, args.records, sql, s.broker.process.pid))
    med: dict[str, dict[str, float]] = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }
    base = med["unfiltered"]
    base_cpu = max(base["broker_cpu_s"], 0.01)  # /proc counts in 10 ms ticks
    out: dict[str, Any] = {
        "records": args.records,
        "produce_s": round(produce_s, 2),
        **{name: {k: round(v, 4) for k, v in m.items()} for name, m in med.items()},
        "selective_rate_over_unfiltered": round(med["selective"]["records_per_s"] / base["records_per_s"], 3),
        "selective_cpu_rate_over_unfiltered": round(
            med["selective"]["records_per_cpu_s"] / base["records_per_cpu_s"], 3
        ),
        "nothing_wall_over_unfiltered": round(med["nothing"]["wall_s"] / base["wall_s"], 3),
        "nothing_broker_cpu_over_unfiltered": round(med["nothing"]["broker_cpu_s"] / base_cpu, 3),
        "nothing_unpruned_wall_over_unfiltered": round(med["nothing_unpruned"]["wall_s"] / base["wall_s"], 3),
    }
    save("sql_filter", out)


if __name__ == "__main__":
    main()
