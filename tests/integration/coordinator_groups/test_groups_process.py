"""The group protocol end to end: real redis-server, coordinator, broker and offset-store processes on
loopback, driven through gRPC stubs."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
import redis

from sluice.codec.batch import BatchBuilder
from sluice.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    offset_store_pb2,
    offset_store_pb2_grpc,
)
from tests.harness import RedisServer, ServiceProcess, restart, run_redis, start_service

COMMON = ("--port", "0", "--metrics-port", "0")


def call(method: Any, request: Any, timeout: float = 10.0) -> Any:
    return method(request, timeout=timeout)


@dataclass
class Cluster:
    redis_server: RedisServer
    coordinator: ServiceProcess
    broker: ServiceProcess
    offset_store: ServiceProcess
    channels: list[grpc.Channel]

    def coordinator_stub(self) -> coordinator_pb2_grpc.CoordinatorStub:
        channel = grpc.insecure_channel(self.coordinator.address)
        self.channels.append(channel)
        return coordinator_pb2_grpc.CoordinatorStub(channel)

    def store_stub(self) -> offset_store_pb2_grpc.OffsetStoreStub:
        channel = grpc.insecure_channel(self.offset_store.address)
        self.channels.append(channel)
        return offset_store_pb2_grpc.OffsetStoreStub(channel)

    def broker_stub(self) -> broker_pb2_grpc.BrokerStub:
        channel = grpc.insecure_channel(self.broker.address)
        self.channels.append(channel)
        return broker_pb2_grpc.BrokerStub(channel)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    services: list[ServiceProcess] = []
    with run_redis() as redis_server, tempfile.TemporaryDirectory() as data_dir:
        c: Cluster | None = None
        try:
            coordinator = start_service("coordinator", *COMMON, "--redis-url", redis_server.url)
            services.append(coordinator)
            broker = start_service(
                "broker", *COMMON, "--data-dir", data_dir, "--coordinator", coordinator.address
            )
            services.append(broker)
            store = start_service("offset-store", *COMMON, "--redis-url", redis_server.url)
            services.append(store)
            c = Cluster(redis_server, coordinator, broker, store, [])
            stub = c.coordinator_stub()
            for name in ("rq", "zombie", "restart", "lag"):
                call(
                    stub.CreateTopic, coordinator_pb2.CreateTopicRequest(name=name, partitions=4), timeout=10
                )
            yield c
        finally:
            if c is not None:
                for channel in c.channels:
                    channel.close()
                services[0] = c.coordinator
            for service in reversed(services):
                service.terminate()


def heartbeat(
    stub: coordinator_pb2_grpc.CoordinatorStub,
    group: str,
    member_id: str = "",
    epoch: int = 0,
    subscription: dict[str, str] | None = None,
    owned: set[tuple[str, int]] | frozenset[tuple[str, int]] = frozenset(),
    **extra: Any,
) -> coordinator_pb2.GroupHeartbeatResponse:
    request = coordinator_pb2.GroupHeartbeatRequest(
        group=group,
        member_id=member_id,
        member_epoch=epoch,
        subscription=subscription or {},
        owned=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(owned)],
        **extra,
    )
    response: coordinator_pb2.GroupHeartbeatResponse = call(stub.Heartbeat, request, timeout=10)
    return response


def parts(response: coordinator_pb2.GroupHeartbeatResponse) -> set[tuple[str, int]]:
    assert response.HasField("assignment"), response
    return {(a.topic, a.partition) for a in response.assignment.partitions}


def test_rocketmq_scenario_reject_names_the_conflict(cluster: Cluster) -> None:
    stub = cluster.coordinator_stub()
    c1 = heartbeat(stub, "rq-reject", subscription={"rq": "tagA"})
    assert c1.error.code == common_pb2.NONE
    assert len(parts(c1)) == 4
    c2 = heartbeat(stub, "rq-reject", subscription={"rq": "tagB"})
    assert c2.error.code == common_pb2.INCONSISTENT_SUBSCRIPTION
    for text in ("'rq'", "'tagA'", "'tagB'", c1.member_id):
        assert text in c2.error.message
    described = call(stub.DescribeGroup, coordinator_pb2.DescribeGroupRequest(group="rq-reject"))
    assert [m.member_id for m in described.members] == [c1.member_id]
    assert any("tagB" in line for line in described.conflicts)


def test_rocketmq_scenario_split_gives_each_consumer_its_own_track(cluster: Cluster) -> None:
    stub = cluster.coordinator_stub()
    config = coordinator_pb2.GroupConfig(conflict_policy="split")
    got = call(stub.SetGroupConfig, coordinator_pb2.SetGroupConfigRequest(group="rq-split", config=config))
    assert got.config.conflict_policy == "split"
    c1 = heartbeat(stub, "rq-split", subscription={"rq": "tagA"})
    c2 = heartbeat(stub, "rq-split", subscription={"rq": "tagB"})
    assert c2.error.code == common_pb2.NONE
    all4 = {("rq", p) for p in range(4)}
    assert parts(c1) == parts(c2) == all4
    tracks1 = {a.track for a in c1.assignment.partitions}
    tracks2 = {a.track for a in c2.assignment.partitions}
    assert tracks1 == {"default"}
    assert len(tracks2) == 1
    assert tracks2 != tracks1
    assert {a.filter for a in c2.assignment.partitions} == {"tagB"}
    # c1 commits on the default track at the offset store (fenced by the coordinator's keys).
    store = cluster.store_stub()
    commit = offset_store_pb2.CommitOffsetsRequest(
        group="rq-split",
        member_id=c1.member_id,
        member_epoch=c1.member_epoch,
        offsets=[offset_store_pb2.PartitionOffset(topic="rq", partition=0, offset=2)],
    )
    [result] = call(store.CommitOffsets, commit).results
    assert result.error.code == common_pb2.NONE, result
    described = call(stub.DescribeGroup, coordinator_pb2.DescribeGroupRequest(group="rq-split"))
    subs = {m.member_id: dict(m.subscription) for m in described.members}
    assert subs == {c1.member_id: {"rq": "tagA"}, c2.member_id: {"rq": "tagB"}}
    committed = {(r.track, r.partition): r.committed for r in described.lag if r.topic == "rq"}
    assert committed[("default", 0)] == 2
    assert {track for track, _ in committed} == {"default", *tracks2}


def _wait_until(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_a_fenced_zombie_cannot_commit(cluster: Cluster) -> None:
    stub, store = cluster.coordinator_stub(), cluster.store_stub()
    a = heartbeat(stub, "zg", subscription={"zombie": "*"}, rebalance_timeout_ms=300)
    assert len(parts(a)) == 4

    def commit(member_id: str, epoch: int, partition: int) -> int:
        request = offset_store_pb2.CommitOffsetsRequest(
            group="zg",
            member_id=member_id,
            member_epoch=epoch,
            offsets=[offset_store_pb2.PartitionOffset(topic="zombie", partition=partition, offset=1)],
        )
        code: int = call(store.CommitOffsets, request).results[0].error.code
        return code

    assert commit(a.member_id, a.member_epoch, 0) == common_pb2.NONE
    b = heartbeat(stub, "zg", subscription={"zombie": "*"})
    a2 = heartbeat(
        stub, "zg", a.member_id, a.member_epoch, {"zombie": "*"}, parts(a), rebalance_timeout_ms=300
    )
    revoked = parts(a) - parts(a2)
    assert len(revoked) == 2
    # a never releases: after its rebalance timeout the coordinator fences it.
    group = coordinator_pb2.DescribeGroupRequest(group="zg")
    _wait_until(lambda: a.member_id not in {m.member_id for m in call(stub.DescribeGroup, group).members})
    for _, partition in sorted(parts(a)):
        assert commit(a.member_id, a.member_epoch, partition) in (
            common_pb2.UNKNOWN_MEMBER,
            common_pb2.STALE_MEMBER_EPOCH,
            common_pb2.NOT_OWNER,
        )
    late = heartbeat(stub, "zg", a.member_id, a.member_epoch, {"zombie": "*"}, parts(a))
    assert late.error.code == common_pb2.UNKNOWN_MEMBER
    b_epoch = call(stub.DescribeGroup, group).members[0].member_epoch
    b2 = heartbeat(stub, "zg", b.member_id, b_epoch, {"zombie": "*"})
    assert parts(b2) == {("zombie", p) for p in range(4)}
    assert commit(b.member_id, b2.member_epoch, 0) == common_pb2.NONE


def test_coordinator_kill_9_keeps_assignments_and_epochs(cluster: Cluster) -> None:
    stub = cluster.coordinator_stub()
    sub = {"restart": "*"}
    a = heartbeat(stub, "rg", subscription=sub, instance_id="host-a")
    b = heartbeat(stub, "rg", subscription=sub)
    a2 = heartbeat(stub, "rg", a.member_id, a.member_epoch, sub, parts(a), instance_id="host-a")
    a3 = heartbeat(stub, "rg", a.member_id, a2.member_epoch, sub, parts(a2), instance_id="host-a")
    b2 = heartbeat(stub, "rg", b.member_id, b.member_epoch, sub)
    held = {a.member_id: (a3.member_epoch, parts(a2)), b.member_id: (b2.member_epoch, parts(b2))}
    before = call(stub.DescribeGroup, coordinator_pb2.DescribeGroupRequest(group="rg"))
    assert before.state == "stable"
    with redis.Redis.from_url(cluster.redis_server.url) as r:
        owners_before = r.hgetall("sluice:grp:{rg}:owners")

    cluster.coordinator.kill()
    cluster.coordinator = restart(cluster.coordinator)
    stub = cluster.coordinator_stub()
    for member_id, (epoch, owned) in held.items():
        again = heartbeat(
            stub, "rg", member_id, epoch, sub, owned, instance_id="host-a" if member_id == a.member_id else ""
        )
        assert again.error.code == common_pb2.NONE, again
        assert again.member_epoch == epoch
        assert not again.HasField("assignment")  # nothing was reassigned
    after = call(stub.DescribeGroup, coordinator_pb2.DescribeGroupRequest(group="rg"))
    assert after.group_epoch == before.group_epoch
    assert [(m.member_id, m.member_epoch, list(m.assigned)) for m in after.members] == [
        (m.member_id, m.member_epoch, list(m.assigned)) for m in before.members
    ]
    with redis.Redis.from_url(cluster.redis_server.url) as r:
        assert r.hgetall("sluice:grp:{rg}:owners") == owners_before


def test_lag_stays_visible_without_members(cluster: Cluster) -> None:
    stub, store = cluster.coordinator_stub(), cluster.store_stub()
    batch = BatchBuilder()
    for i in range(5):
        batch.append(b"v%d" % i, None, "tagA", None, 1_000 + i)
    produce = broker_pb2.ProduceRequest(acks=1, timeout_ms=5000)
    produce.partitions.add(topic="lag", partition=0, records=batch.build())
    assert (
        call(cluster.broker_stub().Produce, produce, timeout=10).partitions[0].error.code == common_pb2.NONE
    )
    m = heartbeat(stub, "lg", subscription={"lag": "*"})
    commit = offset_store_pb2.CommitOffsetsRequest(
        group="lg",
        member_id=m.member_id,
        member_epoch=m.member_epoch,
        offsets=[offset_store_pb2.PartitionOffset(topic="lag", partition=0, offset=2)],
    )
    assert call(store.CommitOffsets, commit).results[0].error.code == common_pb2.NONE
    call(
        stub.LeaveGroup, coordinator_pb2.LeaveGroupRequest(group="lg", member_id=m.member_id, member_epoch=-1)
    )
    described = call(stub.DescribeGroup, coordinator_pb2.DescribeGroupRequest(group="lg"))
    assert described.state == "empty"
    assert not described.members
    row = next(r for r in described.lag if (r.topic, r.partition, r.track) == ("lag", 0, "default"))
    assert (row.committed, row.high_watermark, row.lag) == (2, 5, 3)
    listed = {
        g.group: (g.state, g.members)
        for g in call(stub.ListGroups, coordinator_pb2.ListGroupsRequest()).groups
    }
    assert listed["lg"] == ("empty", 0)


def test_bad_input_is_typed(cluster: Cluster) -> None:
    stub = cluster.coordinator_stub()
    cases = {
        "unknown topic": ({"nope": "*"}, "", common_pb2.UNKNOWN_TOPIC_OR_PARTITION),
        "bad filter": ({"rq": "a b"}, "", common_pb2.INVALID_FILTER),
        "unknown assignor": ({"rq": "*"}, "magic", common_pb2.UNKNOWN_ASSIGNOR),
    }
    for name, (sub, assignor, code) in cases.items():
        r = heartbeat(stub, "bad", subscription=sub, assignor=assignor)
        assert r.error.code == code, name
    future = heartbeat(stub, "rq-reject", "nobody", 9, {"rq": "tagA"})
    assert future.error.code == common_pb2.UNKNOWN_MEMBER
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT|invalid group"):
        heartbeat(stub, "bad group", subscription={"rq": "*"})
    with pytest.raises(Exception, match="does not exist"):
        call(stub.DescribeGroup, coordinator_pb2.DescribeGroupRequest(group="never-seen"))
