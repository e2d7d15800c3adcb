"""The peer layer's ListOffsets planner against two real brokers (and a coordinator, on a private Redis).

Routing is what the test controls: ``leader_of`` starts out wrong (every partition sent to the other
broker, or to an address where nothing listens), the brokers answer with real routing errors, and the
refresh the planner calls puts the routing right. So the refresh rule (once per round, shared by
concurrent calls), the retry bound and the typed errors are seen end to end.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from sluice import Client
from sluice.client.metadata import ClusterMetadata
from sluice.common import list_offsets as planner
from sluice.common.list_offsets import EARLIEST, LATEST, RetryBound, TopicPartition
from sluice.common.peers import AioPeers, AioRefreshGate, Peers, RefreshGate
from sluice.errors import BrokerNotAvailable, InvalidArgument, NotLeader, UnknownTopicOrPartition
from tests.harness import ServiceProcess, free_port, start_service
from tests.integration.client.conftest import Cluster, run_cluster, wait_for_broker

S = TypeVar("S")
TOPIC = "planned"
PARTITIONS = 6
RECORDS = {p: p + 1 for p in range(PARTITIONS)}  # partition p holds p + 1 records


@pytest.fixture(scope="module")
def two_brokers() -> Iterator[tuple[Cluster, ServiceProcess]]:
    with run_cluster() as cluster:
        second = start_service(
            "broker",
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--data-dir",
            str(cluster.data_dir / "second"),
            "--broker-id",
            "2",
            "--coordinator",
            cluster.coordinator.address,
        )
        try:
            wait_for_broker(cluster.bootstrap, second.address)
            with Client(cluster.bootstrap, request_timeout=10) as client:
                client.admin.create_topic(TOPIC, partitions=PARTITIONS)
                with client.producer(TOPIC) as producer:
                    for p, n in RECORDS.items():
                        for i in range(n):
                            producer.send(b"%d" % i, partition=p)
                    producer.flush(timeout=30)
            yield cluster, second
        finally:
            second.terminate()


@pytest.fixture
def metadata(two_brokers: tuple[Cluster, ServiceProcess]) -> ClusterMetadata:
    cluster, _ = two_brokers
    with Client(cluster.bootstrap, request_timeout=10) as client:
        md = client.metadata([TOPIC], refresh=True)
    leaders = {md.leader_address(TOPIC, p) for p in range(PARTITIONS)}
    assert len(leaders) == 2, f"the topic should span both brokers: {leaders}"
    return md


class CountingPeers(Peers):
    """The real channel cache, counting the ListOffsets requests sent to each address."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: Counter[str] = Counter()

    def stub(self, address: str, stub_class: type[S]) -> S:
        self.asked[address] += 1
        return super().stub(address, stub_class)


@dataclass
class Routing:
    """``leader_of`` that starts out wrong and is put right by ``refresh`` (after ``wrong_for`` calls)."""

    md: ClusterMetadata
    wrong: dict[TopicPartition, str]
    wrong_for: int = 1
    refreshes: int = 0
    right: bool = field(default=False)

    def leader_of(self, topic: str, partition: int) -> str | None:
        if not self.right:
            return self.wrong[(topic, partition)]
        return self.md.leader_address(topic, partition)

    def refresh(self) -> None:
        self.refreshes += 1
        self.right = self.refreshes >= self.wrong_for

    async def refresh_async(self) -> None:
        await asyncio.sleep(0.01)  # a real refresh takes a round trip: callers arriving meanwhile wait
        self.refresh()


def wanted() -> list[TopicPartition]:
    return [(TOPIC, p) for p in range(PARTITIONS)]


def swapped(md: ClusterMetadata) -> dict[TopicPartition, str]:
    """Every partition routed to the broker that does not lead it."""
    a, b = sorted({md.leader_address(TOPIC, p) or "" for p in range(PARTITIONS)})
    return {(TOPIC, p): b if md.leader_address(TOPIC, p) == a else a for p in range(PARTITIONS)}


def run(peers: Peers, routing: Routing, timestamp: int = LATEST, rounds: int = 32) -> planner.OffsetsAnswer:
    return planner.list_offsets_blocking(
        peers,
        wanted(),
        timestamp,
        routing.leader_of,
        bound=RetryBound(20, rounds=rounds),
        rpc_timeout=10,
        gate=RefreshGate(routing.refresh),
    )


def test_one_request_per_broker_and_the_answers_merged(metadata: ClusterMetadata) -> None:
    peers = CountingPeers()
    try:
        routing = Routing(metadata, {}, right=True)
        latest = run(peers, routing)
        assert latest.errors == {}
        assert latest.offsets == {(TOPIC, p): n for p, n in RECORDS.items()}
        assert sorted(peers.asked.values()) == [1, 1]  # two brokers, one request each
        earliest = run(peers, routing, EARLIEST)
        assert earliest.offsets == {(TOPIC, p): 0 for p in range(PARTITIONS)}
        assert routing.refreshes == 0
    finally:
        peers.close()


def test_routing_errors_refresh_once_and_retry(metadata: ClusterMetadata) -> None:
    peers = CountingPeers()
    try:
        routing = Routing(metadata, swapped(metadata))
        answer = run(peers, routing)
        assert answer.errors == {}
        assert answer.offsets == {(TOPIC, p): n for p, n in RECORDS.items()}
        assert routing.refreshes == 1  # six partitions refused, one refresh
        assert sorted(peers.asked.values()) == [2, 2]  # two rounds of one request per broker
    finally:
        peers.close()


def test_an_address_where_nothing_listens_is_a_routing_error(metadata: ClusterMetadata) -> None:
    peers = Peers()
    try:
        nobody = f"127.0.0.1:{free_port()}"
        routing = Routing(metadata, dict.fromkeys(wanted(), nobody))
        answer = run(peers, routing)
        assert answer.offsets == {(TOPIC, p): n for p, n in RECORDS.items()}
        assert routing.refreshes == 1
        stuck = Routing(metadata, dict.fromkeys(wanted(), nobody), wrong_for=1_000)
        answer = run(peers, stuck, rounds=2)
        assert all(isinstance(e, BrokerNotAvailable) for e in answer.errors.values())
        assert set(answer.errors) == set(wanted())
    finally:
        peers.close()


def test_the_retry_is_bounded(metadata: ClusterMetadata) -> None:
    peers = Peers()
    try:
        routing = Routing(metadata, swapped(metadata), wrong_for=1_000)  # no refresh puts it right
        started = time.monotonic()
        answer = run(peers, routing, rounds=3)
        assert time.monotonic() - started < 5  # 100 ms + 200 ms of backoff, and six RPCs
        assert routing.refreshes == 2  # between rounds 1-2 and 2-3
        assert answer.offsets == {}
        assert set(answer.errors) == set(wanted())
        assert all(isinstance(e, (NotLeader, UnknownTopicOrPartition)) for e in answer.errors.values())
    finally:
        peers.close()


def test_a_typed_error_ends_the_call_without_a_refresh(metadata: ClusterMetadata) -> None:
    peers = Peers()
    try:
        routing = Routing(metadata, {}, right=True)
        answer = run(peers, routing, timestamp=-5)  # neither a sentinel nor a time
        assert routing.refreshes == 0
        assert set(answer.errors) == set(wanted())
        error = answer.first_error()
        assert isinstance(error, InvalidArgument)
        assert "timestamp must be" in error.message
    finally:
        peers.close()


def test_concurrent_calls_share_one_refresh(metadata: ClusterMetadata) -> None:
    routing = Routing(metadata, swapped(metadata))

    async def main() -> list[planner.OffsetsAnswer]:
        peers = AioPeers()
        gate = AioRefreshGate(routing.refresh_async)
        try:
            calls = [
                planner.list_offsets(
                    peers,
                    wanted(),
                    LATEST,
                    routing.leader_of,
                    bound=RetryBound(20),
                    rpc_timeout=10,
                    gate=gate,
                )
                for _ in range(5)
            ]
            return list(await asyncio.gather(*calls))
        finally:
            await peers.close()

    answers = asyncio.run(main())
    assert routing.refreshes == 1  # five calls, six partitions each, all refused: one refresh
    for answer in answers:
        assert answer.errors == {}
        assert answer.offsets == {(TOPIC, p): n for p, n in RECORDS.items()}


def test_the_sdk_raises_the_typed_error_left(two_brokers: tuple[Cluster, ServiceProcess]) -> None:
    cluster, _ = two_brokers
    with Client(cluster.bootstrap, request_timeout=10) as client:
        assert client.list_offsets(TOPIC, "latest") == RECORDS
        with pytest.raises(UnknownTopicOrPartition, match="no partition 9"):
            client.list_offsets(TOPIC, partitions=[9])
