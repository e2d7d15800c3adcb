"""The SDK's per-record cost, record-wise against bulk: ``send()`` vs ``send_many()``, ``poll()`` vs
``poll_columns()`` (docs/latency.md, "Bulk send and column-wise consume").

Each side runs alone (the producer, then a consumer of what it wrote, from a backlog) against one stack
(coordinator, broker, offset store over a private Redis), the two APIs interleaved round by round
(record-wise, bulk, record-wise, ...) so both see the same machine. Reported per API: records/s (wall) and
the client process's CPU per record (``time.process_time``: the caller's thread plus the SDK's sender and
fetch threads; the services run in processes of their own), median and range over the rounds.

    .venv/bin/python bench/bulk_apis.py --records 300000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from _stack import save, stack

BATCH = 1000
KEY = b"k%015d"
VALUE = b"v" * 100


def produce(bootstrap: str, topic: str, n: int, bulk: bool) -> tuple[float, float]:
    from sluice import Client

    with Client(bootstrap) as client:
        producer = client.producer(topic)
        wall, cpu = time.perf_counter(), time.process_time()
        acked = [0]

        def done(_f: object, count: int = BATCH) -> None:
            acked[0] += count

        for start in range(0, n, BATCH):
            keys = list(map(KEY.__mod__, range(start, start + BATCH)))
            values = [VALUE] * BATCH
            if bulk:
                producer.send_many(values, keys).add_done_callback(done)
            else:
                send = producer.send
                future = None
                for key, value in zip(keys, values, strict=True):
                    future = send(value, key=key)
                assert future is not None
                future.add_done_callback(done)
        producer.flush()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        producer.close()
        assert acked[0] == n, acked
    return wall, cpu


def consume(bootstrap: str, topic: str, group: str, n: int, bulk: bool) -> tuple[float, float]:
    from sluice import Client

    with Client(bootstrap) as client:
        consumer = client.consumer(group, [topic], auto_offset_reset="earliest")
        got = 0
        wall, cpu = time.perf_counter(), time.process_time()
        if bulk:
            while got < n:
                for cols in consumer.poll_columns(1.0).values():
                    got += len(cols.values)
        else:
            while got < n:
                got += len(consumer.poll(1.0))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        consumer.close()
    return wall, cpu


def summary(runs: list[tuple[float, float]], n: int) -> dict[str, Any]:
    rates = [n / w for w, _ in runs]
    cpu_us = [c / n * 1e6 for _, c in runs]
    return {
        "records_per_s": {
            "median": round(statistics.median(rates)),
            "min": round(min(rates)),
            "max": round(max(rates)),
        },
        "cpu_us_per_record": {
            "median": round(statistics.median(cpu_us), 3),
            "min": round(min(cpu_us), 3),
            "max": round(max(cpu_us), 3),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = args.records - args.records % BATCH
    runs: dict[str, list[tuple[float, float]]] = {
        k: [] for k in ("send", "send_many", "poll", "poll_columns")
    }
    load = [os.getloadavg()[0]]
    with stack(push=True) as s:
        from sluice import Client

        with Client(s.bootstrap) as admin:
            for r in range(args.rounds):
                for bulk in (False, True):
                    topic = f"bulk-{r}-{int(bulk)}"
                    admin.admin.create_topic(topic, args.partitions)
                    runs["send_many" if bulk else "send"].append(produce(s.bootstrap, topic, n, bulk))
                    # Each consumer API reads the other API's topic too, alternately: same data either way.
                    runs["poll_columns" if bulk else "poll"].append(
                        consume(s.bootstrap, topic, f"g-{topic}", n, bulk)
                    )
                    load.append(os.getloadavg()[0])
                    print(r, bulk, {k: v[-1] for k, v in runs.items() if v}, flush=True)
    save(
        "bulk_apis",
        {
            "records": n,
            "partitions": args.partitions,
            "rounds": args.rounds,
            "load_average": [round(x, 2) for x in load],
            **{name: summary(v, n) for name, v in runs.items()},
        },
    )


if __name__ == "__main__":
    main()
