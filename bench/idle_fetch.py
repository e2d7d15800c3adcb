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
from collections.abc import Callable
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

from _stack import cpu_seconds, save, stack


def consume(
    bootstrap: str, topic: str, partitions: int, kind: str, transport: str, stop: Event, out: Queue[Any]
) -> None:
    # The SDK's default is the wire protocol wherever the broker advertises a wire port.
    os.environ["SLUICE_CLIENT_TRANSPORT"] = "grpc" if transport == "grpc" else "auto"
    from sluice import Client

    try:
        with Client(bootstrap) as client:
            polls = 0
            poll: Callable[[float], object]
            if kind == "group":
                consumer = client.consumer(f"idle-{transport}", [topic], auto_offset_reset="latest")
                poll = consumer.poll
            else:
                fetcher = client.fetcher({(topic, p): 0 for p in range(partitions)})
                poll = fetcher.fetch
            out.put("ready")
            while not stop.is_set():
                poll(0.5)
                polls += 1
            cpu = time.process_time()
            (consumer if kind == "group" else fetcher).close()
        out.put((polls, cpu))
    except Exception as exc:  # reported by the parent: a figure from a failed consumer is no figure
        out.put(exc)


def settle(pid: int, limit_s: float = 180.0) -> None:
    """Wait until the broker is idle: it goes on applying a new topic's partition updates for
    tens of seconds after CreateTopic answers (about 40 s at 1,000 partitions, measured)."""
    deadline = time.monotonic() + limit_s
    quiet = 0
    while quiet < 3 and time.monotonic() < deadline:
        quiet = quiet + 1 if measure(pid, 2.0) < 1.0 else 0


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
        ready = out.get(timeout=120)
        if ready != "ready":
            raise RuntimeError(f"the {transport} {kind} consumer failed: {ready!r}")
        time.sleep(args.warmup)
        client_cpu = time.monotonic()
        broker = measure(pid, args.seconds)
        stop.set()
        result = out.get(timeout=60)
        if isinstance(result, Exception):
            raise RuntimeError(f"the {transport} {kind} consumer failed: {result!r}")
        polls, cpu = result
        elapsed = time.monotonic() - client_cpu
    finally:
        stop.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return {
        "broker_cpu_pct": round(broker, 2),
        "client_cpu_s": round(cpu, 2),
        "polls_per_s": round(polls / elapsed, 1),
    }


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
            settle(pid)
            time.sleep(args.warmup)
            floor = round(measure(pid, args.seconds), 2)
            print(f"  broker alone: {floor}% of a core", flush=True)
            for transport in args.transports.split(","):
                for kind in args.kinds.split(","):
                    measured = run_consumer(s.bootstrap, pid, topic, partitions, kind, transport, args)
                    row: dict[str, object] = {"partitions": partitions, "transport": transport}
                    row |= {"consumer": kind, "broker_alone_pct": floor, **measured}
                    rows.append(row)
                    print(f"  {transport:5} {kind:8} broker {row['broker_cpu_pct']:6}% "
                          f"(alone {floor}%)  client {row['client_cpu_s']} s  polls/s {row['polls_per_s']}",
                          flush=True)  # fmt: skip
    save(args.name, {"seconds": args.seconds, "rows": rows})


if __name__ == "__main__":
    main()
