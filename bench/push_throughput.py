"""Push-consumer throughput and end-to-end latency (coordinator, broker, offset store, dispatcher).

Phase 1, throughput: a backlog of N records of 100 B on a 4-partition topic, then a
Shared subscription with 2 consumer processes that receive and ack every message
(``receive()`` + ``ack()`` per message). Figure: records/s for both together, from the
first message to the last.

Phase 2, latency: a producer (linger 0) sends at a fixed rate (default 2,000 records/s)
records stamped with CLOCK_MONOTONIC; one push consumer in another process receives
and acks them. The first second (``--warmup``) is sent at the same rate but not counted, as in
``e2e_latency.py``: it holds the one-off costs of a new producer and subscription. Figures:
p50/p99/max of send -> received, and every process's CPU per record meanwhile.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import struct
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event
from typing import Any

from _stack import cpu_seconds, producer_overrides, save, stack

VALUE = b"x" * 100
IDLE_END = 3.0  # a consumer stops after this long without a message
# A latency record: the send time (CLOCK_MONOTONIC), 1 if it belongs to the warm-up, padding to 100 B.
LATENCY_HEADER = struct.Struct("<dB")


def produce_backlog(bootstrap: str, topic: str, n: int) -> None:
    from sluice import Client

    keys = [os.urandom(8).hex().encode() for _ in range(1024)]
    with Client(bootstrap) as client:
        producer = client.producer(topic, **producer_overrides())
        for i in range(n):
            producer.send(VALUE, key=keys[i & 1023])
        producer.flush()
        producer.close()


def consume(bootstrap: str, topic: str, queue_size: int, batch: int, ready: Barrier, out: Queue[Any]) -> None:
    """Receive and ack every message: one by one (``batch`` 1: receive + ack), or ``receive_many`` +
    ``ack_many`` of up to ``batch``. CPU is counted from the first message to the last (start-up
    and imports excluded: they are not per message)."""
    from sluice import Client

    with Client(bootstrap) as client:
        pc = client.push_consumer(
            topic, "bench", "shared", initial_position="earliest", receiver_queue_size=queue_size
        )
        ready.wait()
        receive, ack = pc.receive, pc.ack
        count = 0
        first = last = cpu = 0.0
        try:
            msg = receive(timeout=30)
            first, cpu = time.monotonic(), time.process_time()
            ack(msg)
            count = 1
            if batch > 1:
                receive_many, ack_many = pc.receive_many, pc.ack_many
                while msgs := receive_many(batch, IDLE_END):
                    ack_many(msgs)
                    count += len(msgs)
                raise TimeoutError
            while True:
                msg = receive(timeout=IDLE_END)
                ack(msg)
                count += 1
        except TimeoutError:
            last = time.monotonic() - IDLE_END
        cpu = time.process_time() - cpu
        stats = pc.stats()
        pc.close()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out.put((count, first, last, stats.flow.over_delivered, usage.ru_utime + usage.ru_stime, cpu))


def latency_consumer(bootstrap: str, topic: str, total: int, ready: Event, out: Queue[Any]) -> None:
    from sluice import Client

    lat: list[float] = []
    cpu = 0.0
    with Client(bootstrap) as client:
        pc = client.push_consumer(topic, "lat", "shared", initial_position="latest", receiver_queue_size=1000)
        ready.set()
        clock = time.clock_gettime
        mono = time.CLOCK_MONOTONIC
        seen = 0
        try:
            while seen < total:
                msg = pc.receive(timeout=10)
                now = clock(mono)
                seen += 1
                sent, warmup = LATENCY_HEADER.unpack_from(msg.value)
                if not warmup:
                    if not lat:
                        cpu = time.process_time()
                    lat.append(now - sent)
                pc.ack(msg)
        except TimeoutError:
            pass
        cpu = time.process_time() - cpu
        pc.close()
    out.put((lat, cpu))


def throughput(
    bootstrap: str, n: int, queue_size: int, batch: int, dispatcher_pid: int, redrive: bool = False
) -> dict[str, object]:
    from sluice import Client
    from sluice.client.push import redrive_topic

    with Client(bootstrap) as client:
        client.admin.create_topic("push-bench", partitions=4)
        if redrive:  # an empty redrive topic: the consumers' extra stream, with a tenth of the queue
            client.admin.create_topic(redrive_topic("push-bench", "bench"), partitions=1)
    ctx = mp.get_context("spawn")
    t0 = time.monotonic()
    p = ctx.Process(target=produce_backlog, args=(bootstrap, "push-bench", n))
    p.start()
    p.join()
    print(f"backlog of {n} records produced in {time.monotonic() - t0:.1f} s", flush=True)
    out = ctx.Queue()
    ready = ctx.Barrier(2)
    dispatcher_cpu = cpu_seconds(dispatcher_pid)
    args = (bootstrap, "push-bench", queue_size, batch, ready, out)
    procs = [ctx.Process(target=consume, args=args) for _ in range(2)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=1800) for _ in procs]
    dispatcher_cpu = cpu_seconds(dispatcher_pid) - dispatcher_cpu
    for proc in procs:
        proc.join()
    total = sum(r[0] for r in results)
    start = min(r[1] for r in results)
    end = max(r[2] for r in results)
    return {
        "records": n,
        "received": total,
        "per_consumer": [r[0] for r in results],
        "over_delivered": sum(r[3] for r in results),
        "seconds": round(end - start, 2),
        "records_per_s": round(total / (end - start)),
        "receiver_queue_size": queue_size,
        "batch": batch,
        "redrive_topic": redrive,
        # CPU per message, independent of what else runs on the machine: the consumer processes'
        # whole life, and from their first message to their last (start-up excluded).
        "consumer_cpu_us_per_msg": round(sum(r[4] for r in results) / total * 1e6, 2),
        "consumer_cpu_us_per_msg_receiving": round(sum(r[5] for r in results) / total * 1e6, 2),
        "dispatcher_cpu_us_per_msg": round(dispatcher_cpu / total * 1e6, 2),
    }


def latency(
    bootstrap: str, rate: int, seconds: float, warmup_s: float, pids: dict[str, int]
) -> dict[str, object]:
    from sluice import Client

    warmup = int(rate * warmup_s)
    total = warmup + int(rate * seconds)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ready = ctx.Event()
    with Client(bootstrap) as client:
        client.admin.create_topic("push-latency", partitions=4)
        consumer = ctx.Process(target=latency_consumer, args=(bootstrap, "push-latency", total, ready, out))
        consumer.start()
        assert ready.wait(60)
        producer = client.producer("push-latency", linger=0)
        cpu: dict[str, float] = {}
        interval = 1.0 / rate
        next_at = time.perf_counter()
        clock, mono = time.clock_gettime, time.CLOCK_MONOTONIC
        padding = b"x" * (100 - LATENCY_HEADER.size)
        for i in range(total):
            if i == warmup:
                cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
                cpu["producer"] = time.process_time()
            now = time.perf_counter()
            if now < next_at:
                time.sleep(next_at - now)
            producer.send(LATENCY_HEADER.pack(clock(mono), i < warmup) + padding)
            next_at += interval
        producer.flush()
        lat, consumer_cpu = out.get(timeout=120)
        cpu = {name: cpu_seconds(pid) - cpu[name] for name, pid in pids.items()} | {
            "producer": time.process_time() - cpu["producer"],
            "consumer": consumer_cpu,
        }
        consumer.join()
        producer.close()
    ms: list[float] = sorted(x * 1000 for x in lat)

    def pct(p: float) -> float:
        return round(ms[min(len(ms) - 1, int(len(ms) * p))], 3)

    return {
        "rate": rate,
        "records": len(ms),
        "warmup_records": warmup,
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "max_ms": round(ms[-1], 3),
        # CPU per record while records flow at this rate (idle long-polls included).
        **{f"{name}_cpu_us_per_record": round(c / len(ms) * 1e6, 1) for name, c in cpu.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--receiver-queue", type=int, default=1000)
    parser.add_argument(
        "--batch", type=int, default=1, help="throughput: receive_many/ack_many of up to N (1: receive/ack)"
    )
    parser.add_argument("--rate", type=int, default=2000, help="latency phase: records per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="latency phase: duration")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="latency phase: seconds sent first, not counted"
    )
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument(
        "--redrive-topic",
        action="store_true",
        help="throughput: an (empty) redrive topic of the subscription exists",
    )
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--tls", action="store_true", help="TLS on every port and every client connection")
    parser.add_argument(
        "--auth", action="store_true", help="authentication and ACL authorization on, clients with a JWT"
    )
    args = parser.parse_args()
    result: dict[str, object] = {"tls": args.tls, "auth": args.auth}
    with stack(push=True, tls=args.tls, auth=args.auth) as s:
        if not args.skip_throughput:
            dispatcher_pid = s.extra[-1].process.pid
            result["throughput"] = throughput(
                s.bootstrap, args.records, args.receiver_queue, args.batch, dispatcher_pid, args.redrive_topic
            )
            print(result["throughput"], flush=True)
        if not args.skip_latency:
            pids = {"dispatcher": s.extra[-1].process.pid, "broker": s.broker.process.pid}
            result["latency"] = latency(s.bootstrap, args.rate, args.seconds, args.warmup, pids)
            print(result["latency"], flush=True)
    flags = (("_tls", args.tls), ("_auth", args.auth), ("_redrive", args.redrive_topic))
    suffix = "".join(name for name, on in flags if on)
    save(f"push_throughput{suffix}", result)


if __name__ == "__main__":
    main()
