"""Broker CPU while consumers long-poll idle partitions: it must not grow with the partitions.

One stack (coordinator, broker, offset store, private Redis) per partition count. A topic of
``P`` partitions, nothing produced. First the broker alone (its floor: heartbeats, metrics),
then, one at a time, a consumer process polling it with the default ``max_wait`` (500 ms):

* ``group``: ``client.consumer(group, [topic])``, polling;
* ``fetcher``: ``client.fetcher({every partition: 0})``, fetching;

each over the wire protocol (a followed fetch) and over gRPC (``SLUICE_CLIENT_TRANSPORT=grpc``:
``FetchStream`` with an incremental fetch session). After ``--warmup`` seconds the broker's CPU
(user + system, ``/proc/<pid>/stat``) is read over ``--seconds``; the table shows it as a
percentage of one core, with the floor beside it, and the consumer process's own CPU.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from _stack import cpu_seconds, save, stack


def consume(bootstrap: str, topic: str, partitions: int, kind: str, transport: str, stop: Event, out: Queue[Any]) -> None:
    os.environ["SLUICE_CLIENT_TRANSPORT"] = transport
    from sluice import Client

    with Client(bootstrap) as client:
        polls = 0
        if kind == "group":
            consumer = client.consumer(f"idle-{transport}", [topic], auto_offset_reset="latest")
            out.put("ready")
            while not stop.is_set():
                consumer.poll(0.5)
                polls += 1
            cpu = time.process_time()
            consumer.close()
        else:
            fetcher = client.fetcher({(topic, p): 0 for p in range(partitions)})
            out.put("ready")
            while not stop.is_set():
                fetcher.fetch(0.5)
                polls += 1
            cpu = time.process_time()
            fetcher.close()
    out.put((polls, cpu))


def measure(pid: int, seconds: float) -> float:
    """The broker's CPU over ``seconds``, as a percentage of one core."""
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_seconds(pid) - before) / (time.monotonic() - started)


def run_consumer(
    bootstrap: str, pid: int, topic: str, partitions: int, kind: str, transport: str, args: argparse.Namespace
) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    out: Queue[Any] = ctx.Queue()
    proc = ctx.Process(target=consume, args=(bootstrap, topic, partitions, kind, transport, stop, out))
    proc.start()
    try:
        assert out.get(timeout=120) == "ready"
        time.sleep(args.warmup)
        client_cpu = time.monotonic()
        broker = measure(pid, args.seconds)
        stop.set()
        polls, cpu = out.get(timeout=60)
        elapsed = time.monotonic() - client_cpu
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return {"broker_cpu_pct": round(broker, 2), "client_cpu_s": round(cpu, 2), "polls_per_s": round(polls / elapsed, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--partitions", default="100,1000,5000", help="comma-separated partition counts")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the broker CPU is read")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--transports", default="wire,grpc")
    parser.add_argument("--kinds", default="group,fetcher")
    parser.add_argument("--name", default="idle_fetch", help="the result file's name")
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    for partitions in (int(p) for p in args.partitions.split(",")):
        with stack(push=True) as s:
            from sluice import Client

            pid = s.broker.process.pid
            topic = f"idle{partitions}"
            started = time.monotonic()
            with Client(s.bootstrap) as client:
                client.admin.create_topic(topic, partitions=partitions)
            print(f"{partitions} partitions created in {time.monotonic() - started:.1f} s", flush=True)
            time.sleep(args.warmup)
            floor = round(measure(pid, args.seconds), 2)
            print(f"  broker alone: {floor}% of a core", flush=True)
            for transport in args.transports.split(","):
                for kind in args.kinds.split(","):
                    row = run_consumer(s.bootstrap, pid, topic, partitions, kind, transport, args)
                    row = {"partitions": partitions, "transport": transport, "consumer": kind,
                           "broker_alone_pct": floor, **row}  # fmt: skip
                    rows.append(row)
                    print(f"  {transport:5} {kind:8} broker {row['broker_cpu_pct']:6}% "
                          f"(alone {floor}%)  client {row['client_cpu_s']} s  polls/s {row['polls_per_s']}",
                          flush=True)  # fmt: skip
    save(args.name, {"seconds": args.seconds, "rows": rows})


if __name__ == "__main__":
    main()
