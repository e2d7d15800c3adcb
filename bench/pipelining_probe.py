"""Against a running cluster (``sluice up``): one producer at a fixed rate (linger 0 by default) and a
group consumer in another process; end-to-end and send -> acknowledged p50/p99/p99.9 for one setting of
replication factor, acks, linger and ``max_in_flight``.

The probe behind docs/producer.md "Pipelining and linger" and docs/replication.md "Fourth pass": run it
with the client tree before and after a change (``PYTHONPATH=<tree>/services``), alternating, against
the same cluster, e.g. ``sluice up --brokers 3 --processes separate`` then
``python bench/pipelining_probe.py --replication-factor 3 --acks all``.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import struct
import time
from typing import Any

from sluice import Client

STAMP = struct.Struct("<d")


def _consume(bootstrap: str, topic: str, n: int, out: Any) -> None:
    with Client(bootstrap) as client:
        consumer = client.consumer(f"{topic}-g", [topic], auto_offset_reset="earliest")
        latencies: list[float] = []
        deadline = time.monotonic() + 120
        while len(latencies) < n and time.monotonic() < deadline:
            for record in consumer.poll(0.2):
                latencies.append(time.monotonic() - STAMP.unpack_from(record.value)[0])
        consumer.close()
    out.put(latencies)


def _acked(into: list[float], sent: float, _future: object) -> None:
    into.append(time.monotonic() - sent)


def _summary(name: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    k = len(ms)
    if not k:
        return f"{name}: no samples"
    return f"{name}: n={k} p50 {ms[k // 2]:.2f} p99 {ms[int(k * 0.99)]:.2f} p99.9 {ms[int(k * 0.999)]:.2f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bootstrap", default="127.0.0.1:7600")
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--acks", default="all", choices=["0", "1", "all"])
    parser.add_argument("--linger", default="0ms")
    parser.add_argument("--max-in-flight", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rate", type=int, default=2000, help="records per second")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    n = int(args.rate * args.seconds)
    topic = f"probe{os.getpid()}"
    acks: Any = args.acks if args.acks == "all" else int(args.acks)
    with Client(args.bootstrap) as client:
        client.admin.create_topic(topic, args.partitions, replication_factor=args.replication_factor)
        time.sleep(2)  # leaders elected and known
        out: Any = mp.Queue()
        reader = mp.Process(target=_consume, args=(args.bootstrap, topic, n, out))
        reader.start()
        time.sleep(2)  # the consumer joined
        producer = client.producer(topic, linger=args.linger, acks=acks, max_in_flight=args.max_in_flight)
        acked: list[float] = []
        padding = b"v" * 92
        start = time.monotonic()
        for i in range(n):
            wait = start + i / args.rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            sent = time.monotonic()
            future = producer.send(STAMP.pack(sent) + padding, key=b"k%015d" % i)
            future.add_done_callback(functools.partial(_acked, acked, sent))
        producer.flush()
        e2e = out.get(timeout=180)
        reader.join(30)
        setting = f"rf{args.replication_factor} acks={args.acks} linger={args.linger}"
        setting += f" max_in_flight={args.max_in_flight}"
        print(setting, _summary("e2e", e2e), "|", _summary("ack", acked))
        producer.close()
        client.admin.delete_topic(topic)


if __name__ == "__main__":
    main()
