"""A replicated cluster of real processes for chaos runs: a private Redis, one coordinator elected through
a Redis lease (``--election redis``) on a fixed port, and three brokers; every process can be killed with
``kill -9``, paused with ``SIGSTOP`` and started again.

The coordinator keeps its port across restarts, so brokers and clients keep its address, and with
``--election redis`` a restart on the same address takes the lease over at once (docs/election.md).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from sluice.client import Client
from sluice.codec.batch import decode_records
from sluice.errors import InvalidReplicationFactor
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import broker_pb2_grpc, coordinator_pb2_grpc
from sluice.v1 import coordinator_pb2 as cpb
from tests.harness import ServiceProcess, free_port, run_redis, start_service

BROKERS = 3


def until(
    check: Callable[[], object],
    what: str,
    timeout: float = 30,
    step: float = 0.05,
    state: Callable[[], str] | None = None,
) -> float:
    """Wait until ``check()`` is true; the seconds it took. Raises AssertionError at the deadline (with
    ``state()`` in the message)."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            seen = f"; state: {state()}" if state is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{seen}")
        time.sleep(step)
    return time.monotonic() - started


@dataclass
class ChaosCluster:
    redis_url: str
    data: Path
    session: str
    lag: str
    flush: str
    coordinator_port: int = field(default_factory=free_port)
    coordinator: ServiceProcess | None = None
    brokers: dict[int, ServiceProcess] = field(default_factory=dict)
    paused: set[int] = field(default_factory=set)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.coordinator_port}"

    # ---- processes -------------------------------------------------------------

    def start_coordinator(self) -> None:
        self.coordinator = start_service(
            "coordinator",
            "--port", str(self.coordinator_port), "--metrics-port", "0", "--redis-url", self.redis_url,
            "--broker-heartbeat-interval", "200ms", "--broker-session-timeout", self.session,
            "--election", "redis",
            # A killed coordinator's lease must not hold its successor (same address) back for long.
            "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "300ms",
        )  # fmt: skip

    def kill_coordinator(self) -> None:
        assert self.coordinator is not None
        self.coordinator.kill()

    def start_broker(self, broker_id: int) -> ServiceProcess:
        self.brokers[broker_id] = start_service(
            "broker",
            "--port", "0", "--metrics-port", "0", "--broker-id", str(broker_id),
            "--data-dir", str(self.data / f"b{broker_id}"), "--flush", self.flush,
            "--coordinator", self.bootstrap, "--replica-lag-time-max", self.lag,
        )  # fmt: skip
        return self.brokers[broker_id]

    def kill_broker(self, broker_id: int) -> None:
        self.brokers[broker_id].kill()  # kill -9: no flush, no goodbye

    def pause(self, broker_id: int) -> None:
        self.brokers[broker_id].process.send_signal(signal.SIGSTOP)
        self.paused.add(broker_id)

    def resume(self, broker_id: int) -> None:
        self.brokers[broker_id].process.send_signal(signal.SIGCONT)
        self.paused.discard(broker_id)

    def stop_all(self) -> None:
        for broker_id in list(self.paused):
            self.resume(broker_id)
        for proc in self.brokers.values():
            proc.terminate()
        if self.coordinator is not None:
            self.coordinator.terminate()

    # ---- the controller's view -------------------------------------------------

    def partitions(self, topic: str) -> list[cpb.PartitionDescription]:
        """The topic's partitions as the coordinator describes them; [] while it cannot answer."""
        try:
            with grpc.insecure_channel(self.bootstrap) as channel:
                meta = coordinator_pb2_grpc.CoordinatorStub(channel).Metadata(
                    cpb.MetadataRequest(topics=[topic]), timeout=5
                )
        except grpc.RpcError:
            return []
        return list(meta.topics[0].partitions) if meta.topics else []

    def leader(self, topic: str, partition: int) -> int:
        parts = self.partitions(topic)
        return parts[partition].broker_id if parts else -1

    def fully_in_sync(self, topic: str) -> bool:
        """Every partition led by a live broker with all its replicas in the ISR."""
        parts = self.partitions(topic)
        return bool(parts) and all(len(p.isr) == len(p.replicas) and p.broker_id >= 0 for p in parts)

    def describe(self, topic: str) -> str:
        return "; ".join(
            f"p{p.partition} leader {p.broker_id} epoch {p.leader_epoch} isr {list(p.isr)} elr {list(p.elr)}"
            for p in self.partitions(topic)
        )

    def create_topic(self, topic: str, partitions: int) -> None:
        """Factor 3, min ISR 2; retried while the brokers are still registering."""
        deadline = time.monotonic() + 30
        with Client(self.bootstrap) as client:
            while True:
                try:
                    client.admin.create_topic(
                        topic, partitions=partitions, replication_factor=BROKERS, min_insync_replicas=2
                    )
                    break
                except InvalidReplicationFactor:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        until(lambda: self.fully_in_sync(topic), "the new topic's replicas to be in sync")

    # ---- the data ----------------------------------------------------------------

    def read_partition(self, topic: str, partition: int, timeout: float = 60) -> list[bytes]:
        """Every record value of one partition up to its high watermark, read from its leader."""
        deadline = time.monotonic() + timeout
        values: list[bytes] = []
        offset = 0
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic}/{partition} within {timeout:g} s")
            leader = self.leader(topic, partition)
            if leader < 0:
                time.sleep(0.1)
                continue
            wanted = pb.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)
            request = pb.FetchRequest(max_wait_ms=0, max_bytes=4 << 20, partitions=[wanted])
            with grpc.insecure_channel(self.brokers[leader].address) as channel:
                answer = broker_pb2_grpc.BrokerStub(channel).Fetch(request, timeout=10).partitions[0]
            if answer.error.code:  # NOT_LEADER right after an election, say: ask again
                time.sleep(0.1)
                continue
            values.extend(r.value for r in decode_records(answer.records, topic, partition, offset))
            offset = answer.next_offset
            if offset >= answer.high_watermark:
                return values

    def segments(self, broker_id: int, topic: str, partition: int) -> bytes:
        directory = self.data / f"b{broker_id}" / f"{topic}-{partition}"
        return b"".join(p.read_bytes() for p in sorted(directory.glob("*.log")))

    def replicas_identical(self, topic: str, partition: int) -> bool:
        copies = {self.segments(b, topic, partition) for b in self.brokers}
        return len(copies) == 1


@contextlib.contextmanager
def chaos_cluster(
    data: Path, session: str = "3s", lag: str = "5s", flush: str = "interval"
) -> Iterator[ChaosCluster]:
    """``session``: the coordinator's broker session timeout (how long a killed leader stays leader);
    ``lag``: the brokers' ``--replica-lag-time-max``."""
    with run_redis(appendonly=False) as redis:
        cluster = ChaosCluster(redis.url, data, session, lag, flush)
        try:
            cluster.start_coordinator()
            for broker_id in range(BROKERS):
                cluster.start_broker(broker_id)
            yield cluster
        finally:
            cluster.stop_all()
