"""Cardinality limits and the partition mutation quota, against real processes configured with small limits:
each refusal is typed (LIMIT_EXCEEDED / THROTTLING_QUOTA_EXCEEDED), names the limit and its value, and the
service keeps serving (docs/limits.md, "Cardinality and rate of change").

The tests share one cluster and run in file order: the topic counts below include the fixture's topic
``h``, and the quota test, last, empties the mutation bucket.
"""

from __future__ import annotations

import queue
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from sluice.codec.batch import encode_records
from sluice.common.rpc import ERROR_CODE_KEY
from sluice.server.interceptors import THROTTLE_TIME_KEY
from sluice.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    dispatcher_pb2,
    dispatcher_pb2_grpc,
)
from tests.cluster import Services, run_services
from tests.harness import run_redis

RATE = 2  # partition mutations a second once the burst is spent
FLAGS: dict[str, tuple[str, ...]] = {
    "coordinator": (
        *("--max-topics", "4", "--max-partitions-per-topic", "6", "--max-partitions", "14"),
        *("--max-groups", "3", "--max-members-per-group", "2"),
        # Two groups at once, then one every 20 s: the fourth creation is throttled.
        *("--group-creations-per-second", "0.05", "--group-creation-burst", "2"),
        *("--partition-mutations-per-second", str(RATE), "--partition-mutation-burst", "40"),
    ),
    "broker": ("--max-record-headers", "3", "--max-record-header-bytes", "200"),
    "dispatcher": ("--max-subscriptions", "2", "--max-consumers-per-subscription", "2"),
}


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    with (
        run_redis() as redis,
        tempfile.TemporaryDirectory(prefix="sluice-limits-") as d,
        run_services(redis, Path(d), flags=lambda s: FLAGS.get(s, ())) as svc,
    ):
        with grpc.insecure_channel(svc.coordinator.address) as ch:
            coordinator_pb2_grpc.CoordinatorStub(ch).CreateTopic(
                coordinator_pb2.CreateTopicRequest(name="h", partitions=1), timeout=15
            )
        yield svc


def _refusal(call: Any, request: Any) -> Any:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=15)
    return info.value


def _code(exc: Any) -> int:
    return int(dict(exc.trailing_metadata())[ERROR_CODE_KEY])


def _limit_refusal(call: Any, request: Any, named: str) -> str:
    exc = _refusal(call, request)
    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
    assert _code(exc) == common_pb2.LIMIT_EXCEEDED, exc.details()
    assert named in exc.details(), exc.details()
    return str(exc.details())


def test_topic_and_partition_limits(services: Services) -> None:
    with grpc.insecure_channel(services.coordinator.address) as ch:
        coord = coordinator_pb2_grpc.CoordinatorStub(ch)
        create, grow = coord.CreateTopic, coord.AddPartitions

        def topic(name: str, partitions: int) -> coordinator_pb2.CreateTopicRequest:
            return coordinator_pb2.CreateTopicRequest(name=name, partitions=partitions)

        _limit_refusal(create, topic("wide", 7), "max_partitions_per_topic=6")
        create(topic("t1", 6), timeout=15)
        create(topic("t2", 6), timeout=15)  # 13 partitions with h's
        details = _limit_refusal(create, topic("t3", 2), "max_partitions=14")
        assert ": 15 would exceed" in details, details
        create(topic("t3", 1), timeout=15)  # 4 topics, 14 partitions
        _limit_refusal(create, topic("t4", 1), "max_topics=4")
        _limit_refusal(
            grow, coordinator_pb2.AddPartitionsRequest(name="t3", partitions=2), "max_partitions=14"
        )
        coord.DeleteTopic(coordinator_pb2.DeleteTopicRequest(name="t3"), timeout=15)
        _limit_refusal(
            grow, coordinator_pb2.AddPartitionsRequest(name="t1", partitions=7), "max_partitions_per_topic=6"
        )
        create(topic("t3", 1), timeout=15)  # room again after the delete
        listed = {
            t.name: len(t.partitions) for t in coord.ListTopics(coordinator_pb2.ListTopicsRequest()).topics
        }
        assert listed == {"h": 1, "t1": 6, "t2": 6, "t3": 1}
        for name in ("t1", "t2", "t3"):
            coord.DeleteTopic(coordinator_pb2.DeleteTopicRequest(name=name), timeout=15)


def _produce(services: Services, headers: dict[str, bytes]) -> broker_pb2.ProducePartitionResponse:
    batch = encode_records([(b"v", None, None, headers, int(time.time() * 1000))])
    request = broker_pb2.ProduceRequest(
        acks=1,
        timeout_ms=10_000,
        partitions=[broker_pb2.ProducePartition(topic="h", partition=0, records=batch)],
    )
    with grpc.insecure_channel(services.broker.address) as ch:
        answer = broker_pb2_grpc.BrokerStub(ch).Produce(request, timeout=15)
    return answer.partitions[0]


def test_record_header_limits(services: Services) -> None:
    assert _produce(services, {"a": b"1", "b": b"2", "c": b"3"}).error.code == common_pb2.NONE
    many = _produce(services, {f"h{i}": b"" for i in range(4)})
    assert many.error.code == common_pb2.LIMIT_EXCEEDED, many
    assert "max_record_headers=3" in many.error.message
    big = _produce(services, {"a": b"x" * 300})
    assert big.error.code == common_pb2.LIMIT_EXCEEDED, big
    assert "max_record_header_bytes=200" in big.error.message


def test_group_and_member_limits_and_the_group_creation_quota(services: Services) -> None:
    with grpc.insecure_channel(services.coordinator.address) as ch:
        coord = coordinator_pb2_grpc.CoordinatorStub(ch)

        def join(group: str) -> coordinator_pb2.GroupHeartbeatResponse:
            request = coordinator_pb2.GroupHeartbeatRequest(
                group=group, member_epoch=0, subscription={"h": ""}
            )
            answer: coordinator_pb2.GroupHeartbeatResponse = coord.Heartbeat(request, timeout=15)
            return answer

        # The second member joins an existing group: no group is created, no token is taken.
        assert [join("g1").error.code for _ in range(2)] == [common_pb2.NONE] * 2
        third = join("g1")
        assert third.error.code == common_pb2.LIMIT_EXCEEDED, third
        assert "max_members_per_group=2" in third.error.message
        assert join("g2").error.code == common_pb2.NONE  # the burst of 2 is used up
        # Admitted while the bucket is not in debt (KIP-599: a request may overdraw it), then refused.
        assert join("g3").error.code == common_pb2.NONE
        exc = _refusal(
            coord.Heartbeat,
            coordinator_pb2.GroupHeartbeatRequest(group="g4", member_epoch=0, subscription={"h": ""}),
        )
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc.details()
        assert _code(exc) == common_pb2.THROTTLING_QUOTA_EXCEEDED, exc.details()
        assert "groups quota" in exc.details()
        assert 0 < int(dict(exc.trailing_metadata())[THROTTLE_TIME_KEY]) <= 20_001


class _Consumer:
    """One open Consume stream; ``first`` is its first event."""

    def __init__(self, channel: grpc.Channel, subscription: str, name: str) -> None:
        self._commands: queue.Queue[dispatcher_pb2.ConsumerCommand | None] = queue.Queue()
        subscribe = dispatcher_pb2.Subscribe(
            topic="h",
            subscription=subscription,
            consumer_name=name,
            consumer_id=f"{subscription}-{name}",
            type=dispatcher_pb2.SUBSCRIPTION_TYPE_SHARED,
        )
        self._commands.put(dispatcher_pb2.ConsumerCommand(subscribe=subscribe))
        self.call = dispatcher_pb2_grpc.DispatcherStub(channel).Consume(
            iter(self._commands.get, None), timeout=60
        )
        self.first: dispatcher_pb2.DispatcherEvent = next(iter(self.call))

    def close(self) -> None:
        self._commands.put(None)
        self.call.cancel()


def test_subscription_and_consumer_limits(services: Services) -> None:
    opened: list[_Consumer] = []
    with grpc.insecure_channel(services.dispatcher.address) as ch:
        try:
            for name in ("c1", "c2", "c3"):
                opened.append(_Consumer(ch, "s1", name))
            assert [c.first.HasField("error") for c in opened[:2]] == [False, False]
            refused = opened[2].first
            assert refused.error.code == common_pb2.LIMIT_EXCEEDED, refused
            assert "max_consumers_per_subscription=2" in refused.error.message
            # A consumer reconnecting under its id is not one more: it replaces its old stream.
            opened.append(_Consumer(ch, "s1", "c1"))
            assert not opened[-1].first.HasField("error"), opened[-1].first
            opened.append(_Consumer(ch, "s2", "c1"))
            assert not opened[-1].first.HasField("error"), opened[-1].first
            opened.append(_Consumer(ch, "s3", "c1"))
            assert opened[-1].first.error.code == common_pb2.LIMIT_EXCEEDED, opened[-1].first
            assert "max_subscriptions=2" in opened[-1].first.error.message
        finally:
            for c in opened:
                c.close()


def test_partition_mutation_quota_throttles_then_admits(services: Services) -> None:
    """Create and delete a 6-partition topic until the bucket is in debt: THROTTLING_QUOTA_EXCEEDED with
    the wait in the message and the trailer; after that wait the same request is admitted."""
    with grpc.insecure_channel(services.coordinator.address) as ch:
        coord = coordinator_pb2_grpc.CoordinatorStub(ch)
        create = coordinator_pb2.CreateTopicRequest(name="q", partitions=6)
        delete = coordinator_pb2.DeleteTopicRequest(name="q")
        throttled: Any = None
        for _ in range(30):  # 12 mutations a cycle against a bucket of 40 refilled at 2/s
            try:
                coord.CreateTopic(create, timeout=15)
                coord.DeleteTopic(delete, timeout=15)
            except grpc.RpcError as exc:
                throttled = exc
                break
        assert throttled is not None, "never throttled"
        assert throttled.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, throttled.details()
        assert _code(throttled) == common_pb2.THROTTLING_QUOTA_EXCEEDED, throttled.details()
        wait_ms = int(dict(throttled.trailing_metadata())[THROTTLE_TIME_KEY])
        # In debt by at most one request (12 partitions): at most 6 s at 2 partitions/s.
        assert 0 < wait_ms <= 12 * 1000 // RATE + 1, wait_ms
        assert f"retry in {wait_ms} ms" in throttled.details()
        time.sleep(wait_ms / 1000 + 0.2)  # the throttle time is the contract under test
        exists = "q" in [t.name for t in coord.ListTopics(coordinator_pb2.ListTopicsRequest()).topics]
        (coord.DeleteTopic(delete, timeout=15) if exists else coord.CreateTopic(create, timeout=15))
