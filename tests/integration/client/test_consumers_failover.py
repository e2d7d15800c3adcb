"""Consumers across a failover, with real processes (docs/replication.md, "Consumers across a failover").

Three brokers, a topic of factor 3 (min ISR 2), an offset store, a dispatcher. While an acks=all
producer, a group consumer, a push consumer and a low-level fetcher run, the partition's leader is
killed with kill -9. The controller elects a new leader from the ISR once its session expires. None of
the applications sees an exception; every acknowledged record is consumed; the fetcher and the group
consumer read every offset exactly once, in order (nothing skipped, nothing read twice: a clean
election truncates nothing); and every record any of them saw is in the final log at the same offset
(none was above the high watermark).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sluice import Client
from sluice.client.producer import FutureRecordMetadata
from sluice.errors import RequestTimedOut
from tests.harness import ServiceProcess, free_port, run_redis, start_service
from tests.integration.broker.test_replication import BROKERS, Cluster, create, until

TOPIC = "fo"


@contextlib.contextmanager
def failover_cluster(tmp: Path) -> Iterator[tuple[Cluster, list[ServiceProcess]]]:
    """The replication cluster (3 s broker sessions), plus an offset store and a dispatcher."""
    with run_redis(appendonly=False) as redis:
        os_port = free_port()
        coordinator = start_service(
            "coordinator",
            *("--port", "0", "--metrics-port", "0", "--redis-url", redis.url),
            *("--offset-store", f"127.0.0.1:{os_port}"),
            *("--broker-heartbeat-interval", "200ms", "--broker-session-timeout", "3s"),
        )
        cluster = Cluster(coordinator, tmp)
        others: list[ServiceProcess] = []
        try:
            for broker_id in range(BROKERS):
                cluster.start_broker(broker_id)
            others.append(
                start_service(
                    "offset-store",
                    *("--port", str(os_port), "--metrics-port", "0", "--redis-url", redis.url),
                    *("--coordinator", coordinator.address),
                )
            )
            others.append(
                start_service(
                    "dispatcher",
                    *("--port", "0", "--metrics-port", "0", "--coordinator", coordinator.address),
                    *("--dispatcher-id", "d0", "--cursor-flush-interval", "50ms"),
                )
            )
            yield cluster, others
        finally:
            for proc in others:
                proc.terminate()
            for broker in cluster.brokers.values():
                if broker.alive():
                    broker.stop()
            coordinator.terminate()


class Worker(threading.Thread):
    """Runs ``step`` until stopped; an exception from it is the application's error."""

    def __init__(self, step: Callable[[], None]) -> None:
        super().__init__(daemon=True)
        self.step = step
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        deadline = time.monotonic() + 120
        try:
            while not self.stop.is_set() and time.monotonic() < deadline:
                self.step()
        except BaseException as exc:
            self.errors.append(exc)


def test_consumers_and_producer_ride_through_a_leader_killed_with_kill_9(tmp_path: Path) -> None:
    with failover_cluster(tmp_path) as (cluster, _), Client(cluster.coordinator.address) as client:
        create(cluster, TOPIC)
        producer = client.producer(TOPIC, linger="2ms", delivery_timeout="60s", request_timeout="5s")
        sent: list[tuple[bytes, FutureRecordMetadata]] = []

        def produce() -> None:
            value = b"v%d" % len(sent)
            sent.append((value, producer.send(value)))
            time.sleep(0.004)

        fetcher = client.fetcher({(TOPIC, 0): 0}, max_wait_ms=200)
        fetched: list[tuple[int, bytes]] = []

        def fetch() -> None:
            fetched.extend((r.offset, r.value or b"") for r in fetcher.fetch(timeout=0.5))

        consumer = client.consumer("g", TOPIC, auto_offset_reset="earliest")
        consumed: list[tuple[int, bytes]] = []

        def consume() -> None:
            records = consumer.poll(0.5)
            consumed.extend((r.offset, r.value or b"") for r in records)
            if records:
                consumer.commit()

        pc = client.push_consumer(TOPIC, "s", "exclusive", initial_position="earliest")
        pushed: list[bytes] = []

        def receive() -> None:
            with contextlib.suppress(RequestTimedOut):
                msg = pc.receive(timeout=0.5)
                pushed.append(msg.value or b"")
                pc.ack(msg)

        workers = [Worker(produce), Worker(fetch), Worker(consume), Worker(receive)]
        for w in workers:
            w.start()
        until(lambda: len(fetched) >= 200 and len(consumed) >= 200, "records before the kill", timeout=30)
        old = cluster.partition(TOPIC)
        cluster.brokers[old.broker_id].kill()  # kill -9
        cluster.brokers[old.broker_id].close()
        until(
            lambda: cluster.partition(TOPIC).broker_id not in (old.broker_id, -1), "a new leader", timeout=20
        )
        produced_at_election = len(sent)
        until(lambda: len(sent) >= produced_at_election + 200, "produce on the new leader", timeout=30)
        workers[0].stop.set()
        workers[0].join(10)
        producer.flush(60)
        acked = {value for value, future in sent if future.exception(timeout=0) is None}
        until(
            lambda: (
                acked <= {v for _, v in fetched}
                and acked <= {v for _, v in consumed}
                and acked <= set(pushed)
            ),
            "every acknowledged record consumed",
            timeout=45,
        )
        for w in workers:
            w.stop.set()
        for w in workers:
            w.join(10)
        assert [w.errors for w in workers] == [[], [], [], []]
        failed = [(v, f.exception(timeout=0)) for v, f in sent if f.exception(timeout=0) is not None]
        assert failed == []  # no send failed either: the retries are the SDK's
        assert cluster.partition(TOPIC).leader_epoch == old.leader_epoch + 1
        # Exactly once, in order: no offset skipped, none read twice.
        assert [o for o, _ in fetched] == list(range(len(fetched)))
        assert [o for o, _ in consumed] == list(range(len(consumed)))
        # Nothing seen above the high watermark: every record read is in the final log, at its offset.
        with client.fetcher({(TOPIC, 0): 0}) as check:
            log: dict[int, bytes] = {}
            while len(log) < len(fetched):
                log.update((r.offset, r.value or b"") for r in check.fetch(timeout=5))
        assert dict(fetched) == {o: log[o] for o, _ in fetched}
        assert dict(consumed) == {o: log[o] for o, _ in consumed}
        assert fetcher.truncations == 0
        fetcher.close()
        consumer.close()
        pc.close()
