"""Consumers across a failover, with real processes (docs/replication.md, "Consumers across a failover").

Three brokers, a topic of factor 3 (min ISR 2), an offset store, a dispatcher. While an acks=all
producer, a group consumer, a push consumer and a low-level fetcher run, the partition's leader is
killed with kill -9. The controller elects a new leader from the ISR once its session expires. None of
the applications sees an exception; every acknowledged record is consumed; the fetcher and the group
consumer read every offset exactly once, in order (nothing skipped, nothing read twice: a clean
election truncates nothing); and every record any of them saw is in the final log at the same offset
(none was above the high watermark); and ListOffsets latest, what the Spark source's
latestOffset asks, never goes backwards.
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from sluice import Client
from sluice.client.fetcher import Fetcher
from sluice.client.producer import FutureRecordMetadata
from sluice.errors import RequestTimedOut
from tests.harness import ServiceProcess, free_port, run_redis, start_service
from tests.integration.broker.conftest import make_batch
from tests.integration.broker.test_replication import BROKERS, Cluster, create, isr, until

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
    with failover_cluster(tmp_path) as (cluster, others), Client(cluster.coordinator.address) as client:
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

        latest: list[int] = []

        def list_latest() -> None:  # what the Spark source's latestOffset asks (spark/reading.py, Planner)
            latest.append(client.list_offsets(TOPIC, "latest")[0])
            time.sleep(0.05)

        workers = [Worker(produce), Worker(fetch), Worker(consume), Worker(receive), Worker(list_latest)]
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
        assert [w.errors for w in workers] == [[], [], [], [], []]
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
        # The latest offset (the high watermark) never went backwards across the failover.
        assert latest == sorted(latest)
        assert latest[-1] <= len(log)
        assert fetcher.truncations == 0
        # The dispatcher's feed checked its position with the new leader (KIP-320): nothing truncated.
        metrics = urllib.request.urlopen(f"http://{others[1].metrics}/metrics", timeout=10).read().decode()
        assert "sluice_dispatcher_log_truncations_total{" not in metrics
        fetcher.close()
        consumer.close()
        pc.close()


def read_until(fetcher: Fetcher, out: list[tuple[int, bytes]], n: int, timeout: float = 30) -> None:
    """Fetch into ``out`` until it holds ``n`` records (an exception from the fetcher fails the test)."""
    deadline = time.monotonic() + timeout
    while len(out) < n:
        assert time.monotonic() < deadline, f"read {len(out)} of {n} records"
        out.extend((r.offset, r.value or b"") for r in fetcher.fetch(timeout=0.5))


def test_a_fetcher_detects_records_truncated_by_an_unclean_election_and_reads_on_from_the_divergence(
    tmp_path: Path,
) -> None:
    """Min ISR 1 and unclean election on: the followers die, the leader alone commits more records, a
    fetcher reads them, then the leader dies too and a follower that never had them is elected. The
    fetcher asks the new leader where its old epoch ends, goes back there (a warning, one truncation
    counted) instead of reading past it, and then reads the new leader's records from there: no offset
    skipped. A group consumer that committed past the divergence in the old epoch resumes the same way:
    the commit carries its leader epoch (KIP-320), checked with the new leader before fetching."""
    with failover_cluster(tmp_path) as (cluster, _), Client(cluster.coordinator.address) as client:
        client.admin.create_topic(
            "unc", replication_factor=3, min_insync_replicas=1, unclean_leader_election=True
        )
        until(lambda: cluster.partition("unc").broker_id >= 0, "a leader")
        state = cluster.partition("unc")
        leader = cluster.brokers[state.broker_id]
        followers = [i for i in sorted(cluster.brokers) if i != state.broker_id]
        producer = client.producer("unc", linger="1ms", delivery_timeout="60s")
        for i in range(20):
            producer.send(b"a%d" % i)
        producer.flush(30)
        until(
            lambda: all(
                cluster.segments(f, "unc") == cluster.segments(state.broker_id, "unc") for f in followers
            ),
            "the followers to hold the first records",
        )
        for f in followers:
            cluster.brokers[f].kill()
            cluster.brokers[f].close()
        until(lambda: isr(cluster, "unc") == [state.broker_id], "the ISR to shrink to the leader", timeout=30)
        for i in range(10):
            producer.send(b"lost%d" % i)
        producer.flush(30)  # acks=all with min ISR 1: committed by the leader alone
        fetcher = client.fetcher({("unc", 0): 0}, max_wait_ms=100)
        seen: list[tuple[int, bytes]] = []
        read_until(fetcher, seen, 30)
        assert [o for o, _ in seen] == list(range(30))
        consumer = client.consumer("gu", "unc", auto_offset_reset="earliest")
        polled: list[int] = []
        deadline = time.monotonic() + 30
        while len(polled) < 30 and time.monotonic() < deadline:
            polled += [r.offset for r in consumer.poll(0.5)]
        assert polled == list(range(30))
        consumer.commit()
        consumer.close()
        # The leader dies; a follower without the last 10 records comes back and is elected uncleanly.
        leader.kill()
        leader.close()
        cluster.start_broker(followers[0])
        until(lambda: cluster.partition("unc").broker_id == followers[0], "an unclean election", timeout=30)
        new_leader = cluster.brokers[followers[0]]
        until(
            lambda: new_leader.produce("unc", 0, make_batch([b"n0", b"n1"]), acks=1).error.code == 0,
            "a write on the new leader",
        )
        after: list[tuple[int, bytes]] = []
        read_until(fetcher, after, 2)
        assert fetcher.truncations == 1
        # Read from where the logs diverge (offset 20): the new leader's records, nothing skipped.
        assert after[:2] == [(20, b"n0"), (21, b"n1")]
        fetcher.close()
        # The group resumes from its commit (30, in the old epoch): validated, it reads on from 20. Without
        # the epoch it would wait at 30, past the new log's end, for records that will never be there.
        resumed = client.consumer("gu", "unc", auto_offset_reset="none")
        again: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 30
        while len(again) < 2 and time.monotonic() < deadline:
            again += [(r.offset, r.value or b"") for r in resumed.poll(0.5)]
        assert again[:2] == [(20, b"n0"), (21, b"n1")]
        resumed.close()
