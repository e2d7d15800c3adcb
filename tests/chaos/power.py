"""Three real brokers under the power-loss seam (``fsync_ledger.py``), a coordinator on a private Redis, a
factor-3 topic with min ISR 2, and an ``acks=all`` idempotent producer at load: what the power-loss and
corruption scenarios share (``tests/chaos/test_power_loss.py``, ``bench/chaos/power_loss.py``)."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from sluice.client import Client
from sluice.client.producer import FutureRecordMetadata, Producer
from sluice.errors import InvalidReplicationFactor, SluiceError
from sluice.v1 import coordinator_pb2 as cpb
from sluice.v1 import coordinator_pb2_grpc
from tests.chaos.fsync_ledger import baseline, power_cut
from tests.harness import ServiceProcess, run_redis, start_service

BROKERS = 3
TOPIC = "power"
#: The brokers' --flush-interval (their default) under flush=interval.
FLUSH_INTERVAL_S = 1.0


def until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class PowerCluster:
    root: Path
    coordinator: ServiceProcess
    flush: str
    brokers: dict[int, ServiceProcess] = field(default_factory=dict)

    def data(self, broker_id: int) -> Path:
        return self.root / f"b{broker_id}"

    def ledger(self, broker_id: int) -> Path:
        return self.root / f"ledger-b{broker_id}"

    def start(self, broker_id: int) -> None:
        data = self.data(broker_id)
        if not data.exists():
            data.mkdir(parents=True)
            baseline(data, self.ledger(broker_id))
        self.brokers[broker_id] = start_service(
            "broker",
            "--port", "0",
            "--metrics-port", "0",
            "--data-dir", str(data),
            "--broker-id", str(broker_id),
            "--flush", self.flush,
            "--coordinator", self.coordinator.address,
            "--replica-lag-time-max", "10s",  # longer than any outage here: a shrink is the below-HW rule
            wrap=("tests.chaos.fsync_ledger", str(self.ledger(broker_id))),
        )  # fmt: skip

    def kill(self, broker_id: int) -> None:
        self.brokers[broker_id].kill()

    def power_loss(self, broker_id: int) -> dict[str, int]:
        """kill -9, then every file cut back to what was synced (a power cut of that machine)."""
        self.kill(broker_id)
        return power_cut(self.data(broker_id), self.ledger(broker_id))

    def isr_shrinks(self, broker_id: int) -> float:
        """``sluice_broker_isr_shrinks_total`` of one broker (replicas that left the ISR it leads)."""
        text = urllib.request.urlopen(f"http://{self.brokers[broker_id].metrics}/metrics", timeout=5).read()
        for line in text.decode().splitlines():
            if line.startswith("sluice_broker_isr_shrinks_total"):
                return float(line.split()[-1])
        return 0.0

    def partition(self) -> cpb.PartitionDescription:
        stub = coordinator_pb2_grpc.CoordinatorStub(grpc.insecure_channel(self.coordinator.address))
        meta = stub.Metadata(cpb.MetadataRequest(topics=[TOPIC]), timeout=10)
        return meta.topics[0].partitions[0]

    def leader(self) -> int:
        return self.partition().broker_id

    def segments(self, broker_id: int) -> bytes:
        directory = self.data(broker_id) / f"{TOPIC}-0"
        return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))

    def create_topic(self, segment_bytes: int = 64 * 1024) -> None:
        deadline = time.monotonic() + 30
        with Client(self.coordinator.address) as client:
            while True:
                try:
                    client.admin.create_topic(
                        TOPIC,
                        config={"segment_bytes": segment_bytes},
                        replication_factor=3,
                        min_insync_replicas=2,
                    )
                    return
                except InvalidReplicationFactor:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)


@contextlib.contextmanager
def power_cluster(
    root: Path, flush: str, session: str = "3s", segment_bytes: int = 64 * 1024
) -> Iterator[PowerCluster]:
    with run_redis(appendonly=False) as redis:
        coordinator = start_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url,
            "--broker-heartbeat-interval", "200ms", "--broker-session-timeout", session,
        )  # fmt: skip
        cluster = PowerCluster(root, coordinator, flush)
        try:
            for broker_id in range(BROKERS):
                cluster.start(broker_id)
            cluster.create_topic(segment_bytes)
            yield cluster
        finally:
            for broker in cluster.brokers.values():
                broker.terminate()
            coordinator.terminate()


class Load:
    """An ``acks=all`` idempotent producer (the SDK's default) sending distinct values at a steady pace."""

    def __init__(self, client: Client, pace: int = 2000) -> None:
        self.producer: Producer = client.producer(
            TOPIC,
            linger="2ms",
            retries=1000,
            retry_backoff_max="500ms",
            delivery_timeout="120s",
            request_timeout="5s",
        )
        self.sent: list[tuple[bytes, FutureRecordMetadata]] = []
        #: When each acknowledged value was acknowledged (time.monotonic()).
        self.acked_at: dict[bytes, float] = {}
        self._stop = threading.Event()
        self._pace = pace
        self._thread = threading.Thread(target=self._run, daemon=True, name="power-load")
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set() and i < 10_000_000:
            value = b"%d" % i
            try:
                future = self.producer.send(value)
            except SluiceError:  # closed by stop() while send() waited for buffer space
                return
            future.add_done_callback(self._answered(value))
            self.sent.append((value, future))
            i += 1
            if i % 20 == 0:
                time.sleep(20 / self._pace)

    def _answered(self, value: bytes) -> Callable[[FutureRecordMetadata], None]:
        def answered(future: FutureRecordMetadata) -> None:
            if future.exception(timeout=0) is None:
                self.acked_at[value] = time.monotonic()

        return answered

    def acked(self) -> list[bytes]:
        return [v for v, f in list(self.sent) if f.done() and f.exception(timeout=0) is None]

    def wait_acked(self, more: int, timeout: float = 90) -> None:
        """Until ``more`` records beyond those acknowledged now are acknowledged."""
        target = len(self.acked()) + more
        until(lambda: len(self.acked()) >= target, f"{more} more acknowledged records", timeout)

    def stop(self) -> list[bytes]:
        """Stop sending, wait for every answer; the acknowledged values, in send order."""
        self._stop.set()
        self._thread.join(30)
        self.producer.flush(timeout=120)
        self.producer.close(timeout=10)
        return self.acked()


@dataclass(frozen=True)
class Verdict:
    acked: int
    stored: int
    lost: int
    duplicates: int
    out_of_order: int
    #: The acknowledged values missing from the log.
    missing: tuple[bytes, ...] = ()


def verify(cluster: PowerCluster, acked: list[bytes]) -> Verdict:
    """Consume the whole partition from its leader: which acknowledged values are missing, stored twice,
    or out of send order."""
    with Client(cluster.coordinator.address, request_timeout=10) as client:
        end, still = -1, 0
        for _ in range(300):  # the HW may still be moving up to the log end (after an election)
            before = end
            with contextlib.suppress(Exception):
                end = client.list_offsets(TOPIC, "latest")[0]
            still = still + 1 if end == before else 0
            # Every value is distinct, so a log holding them all has at least that many records; one
            # that lost some stops short: settled when the HW has not moved for 2 s.
            if end >= len(acked) or (end > 0 and still >= 10):
                break
            time.sleep(0.2)
        values: list[bytes] = []
        with client.fetcher({(TOPIC, 0): 0}) as f:
            deadline = time.monotonic() + 60
            while f.positions()[(TOPIC, 0)] < end and time.monotonic() < deadline:
                values += [r.value for r in f.fetch(timeout=1.0)]
    stored = set(values)
    position = {v: i for i, v in enumerate(values)}
    in_log = [position[v] for v in acked if v in position]
    return Verdict(
        acked=len(acked),
        stored=len(values),
        lost=sum(1 for v in acked if v not in stored),
        duplicates=len(values) - len(stored),
        out_of_order=sum(1 for a, b in itertools.pairwise(in_log) if b < a),
        missing=tuple(v for v in acked if v not in stored),
    )
