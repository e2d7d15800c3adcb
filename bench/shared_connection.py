"""1,000 group consumers and a producer on one ``Client``: how many broker connections, and what
they cost (issue 20, "one broker connection per Client"; docs/consumer.md, "Many consumers on
one Client").

One stack (coordinator, broker, offset store, private Redis). This process makes one Client,
``--consumers`` group consumers on it (each in a group of its own, so each reads the whole
topic and no rebalance mixes in) and a producer, produces ``--records`` records, and polls every
consumer in turn (``poll(timeout=0)``, round robin) until each has them all. It reports:

* the broker's ``sluice_broker_wire_connections`` and this process's sockets to the broker's
  wire port, with everyone open (expected: 1 each);
* this process's threads and RSS before the consumers and with them all open, and the RSS and
  threads each consumer adds (no thread: the Client's group and fetch drivers serve them all; ~55 KB
  measured, docs/consumer.md says where it goes);
* the seconds to create the consumers (each joins its group before ``client.consumer`` returns),
  for their first polls to take on their assignments and look up their positions (nothing
  produced yet), and then, records produced, until every consumer got its first record and every
  record (with the client's and the broker's CPU seconds meanwhile);
* the latency of one more record to the last of the consumers;
* this process's RSS and threads, and the broker's RSS;
* the CPU this process and the broker use over ``--idle-seconds`` with nothing produced.

Run it on the code before shared connections to compare (one connection per consumer there), and
on the code before the shared drivers (a thread per consumer's heartbeat, stream and prefetch:
keep ``--consumers`` at 200 or fewer there, 1,000 made 3,700 threads).
Results go to ``bench/results/shared_connection.json``.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time
import uuid

from _stack import cpu_seconds, rss_mb, save, stack
from sluice import Client
from sluice.client.consumer import Consumer


def main() -> None:
    from tests.wire_client import sockets_to, wire_connections  # on the path once _stack is imported

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--consumers", type=int, default=1000)
    parser.add_argument("--records", type=int, default=20)
    parser.add_argument(
        "--session-timeout",
        default="45s",
        help="the consumers' session_timeout (the default's; the thread-per-consumer design needed 5m)",
    )
    parser.add_argument(
        "--fetch-max-wait",
        default="500ms",
        help="the consumers' fetch_max_wait (an idle follow answers this often)",
    )
    parser.add_argument(
        "--idle-seconds", type=float, default=10.0, help="how long to measure CPU with nothing produced"
    )
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1)  # kill -USR1 <pid>: where every thread is
    results: dict[str, object] = {"consumers": args.consumers, "records": args.records}
    with stack(push=True) as s, Client(s.bootstrap, request_timeout=60) as client:
        topic = f"shared-{uuid.uuid4().hex[:8]}"
        client.admin.create_topic(topic, partitions=2)
        (broker,) = client.metadata(refresh=True).brokers.values()
        assert broker.wire_address is not None
        wire_port = int(broker.wire_address.rsplit(":", 1)[1])
        # The connection (and its reader thread) exists before counting: a record to another topic.
        client.admin.create_topic(f"warm-{topic}", partitions=1)
        with client.producer(f"warm-{topic}") as warm:
            warm.send(b"warm").result(timeout=60)
        threads_before, rss_before = threading.active_count(), rss_mb_self()
        results["client_threads_before"] = threads_before
        results["client_rss_mb_before"] = round(rss_before, 1)
        started = time.perf_counter()
        consumers = []
        for i in range(args.consumers):
            consumers.append(
                client.consumer(
                    f"g{i}-{topic}",
                    [topic],
                    auto_offset_reset="earliest",
                    session_timeout=args.session_timeout,
                    fetch_max_wait=args.fetch_max_wait,
                )
            )
            if (i + 1) % 100 == 0:
                print(f"{i + 1} consumers after {time.perf_counter() - started:.1f} s", file=sys.stderr)
        results["create_s"] = round(time.perf_counter() - started, 2)
        results["client_threads_with_consumers"] = threading.active_count()
        results["threads_per_consumer"] = round(
            (threading.active_count() - threads_before) / args.consumers, 3
        )
        # As an application's poll loop would: each consumer's first polls take on its assignment and
        # look up its positions (an OffsetFetch each, on the polling thread, as in Kafka); only then
        # does it fetch. Timed apart, so the delivery below measures fetching.
        started = time.perf_counter()
        results["consumers_not_fetching"] = settle(consumers, deadline=time.monotonic() + 180)
        results["assign_and_position_all_s"] = round(time.perf_counter() - started, 2)
        # Every consumer has joined and follows its partitions: count the connections now.
        results["broker_wire_connections_after_create"] = wire_connections(s.broker.metrics, "broker")
        results["client_sockets_after_create"] = sockets_to(wire_port)
        print(f"after create: {results}", file=sys.stderr)
        with client.producer(topic, linger="5ms") as producer:
            for f in [producer.send(b"r%d" % i, partition=i % 2) for i in range(args.records)]:
                f.result(timeout=60)
            client_cpu, broker_cpu = sum(os.times()[:2]), cpu_seconds(s.broker.process.pid)
            started = time.perf_counter()
            got, firsts = deliver(consumers, args.records, deadline=time.monotonic() + 180)
            # Who the delivery waited for: this process (decoding, polling) or the broker (answering).
            results["deliver_client_cpu_s"] = round(sum(os.times()[:2]) - client_cpu, 2)
            results["deliver_broker_cpu_s"] = round(cpu_seconds(s.broker.process.pid) - broker_cpu, 2)
            results["first_record_to_all_s"] = round(max(firsts, default=0.0) - started, 2)
            results["deliver_all_s"] = round(time.perf_counter() - started, 2)
            results["consumers_without_records"] = sum(1 for n in got if n == 0)
            results["records_missing"] = sum(args.records - n for n in got)
            results["broker_wire_connections"] = wire_connections(s.broker.metrics, "broker")
            results["client_sockets_to_broker_wire_port"] = sockets_to(wire_port)
            results["client_rss_mb"] = round(rss_mb_self(), 1)
            results["client_rss_kb_per_consumer"] = round(
                (rss_mb_self() - rss_before) * 1024 / args.consumers, 1
            )
            results["client_threads"] = threading.active_count()
            results["broker_rss_mb"] = round(rss_mb(s.broker.process.pid), 1)
            # Idle: every consumer's follow answers empty each fetch_max_wait; heartbeats go on.
            client_cpu, broker_cpu = sum(os.times()[:2]), cpu_seconds(s.broker.process.pid)
            time.sleep(args.idle_seconds)
            results["idle_client_cpu_pct"] = round(
                (sum(os.times()[:2]) - client_cpu) / args.idle_seconds * 100, 1
            )
            results["idle_broker_cpu_pct"] = round(
                (cpu_seconds(s.broker.process.pid) - broker_cpu) / args.idle_seconds * 100, 1
            )
            sent = time.perf_counter()
            producer.send(b"late", partition=0).result(timeout=60)
            results["late_ack_ms"] = round((time.perf_counter() - sent) * 1000, 1)
            for c in consumers:
                deadline = time.monotonic() + 60
                while not c.poll(timeout=1.0) and time.monotonic() < deadline:
                    pass
            results["late_record_to_all_s"] = round(time.perf_counter() - sent, 2)
        for c in consumers:
            c.close()
    save("shared_connection", results)


def settle(consumers: list[Consumer], deadline: float) -> int:
    """Poll every consumer in turn (nothing is produced yet) until each holds both partitions with
    a position; returns how many did not by the deadline."""
    todo = list(consumers)
    while todo and time.monotonic() < deadline:
        for c in todo:
            c.poll(timeout=0)
        todo = [c for c in todo if not _fetching(c)]
        if todo:
            time.sleep(0.01)
    return len(todo)


def _fetching(c: Consumer) -> bool:
    held = c.assignment()
    return len(held) == 2 and all(c.position(tp) is not None for tp in held)


def deliver(consumers: list[Consumer], records: int, deadline: float) -> tuple[list[int], list[float]]:
    """Poll every consumer in turn without waiting until each has ``records`` records (or the
    deadline): how many each got, and when (perf_counter) each got its first."""
    got = [0] * len(consumers)
    firsts: list[float] = []
    todo = list(range(len(consumers)))
    while todo and time.monotonic() < deadline:
        left = []
        for i in todo:
            n = len(consumers[i].poll(timeout=0))
            if n and not got[i]:
                firsts.append(time.perf_counter())
            got[i] += n
            if got[i] < records:
                left.append(i)
        time.sleep(0.01)  # a round of 1,000 polls holds the GIL: let the drivers work between rounds
        todo = left
    return got, firsts


def rss_mb_self() -> float:
    return rss_mb(os.getpid())


if __name__ == "__main__":
    main()
