"""Helpers of the topic-identity tests: a private push cluster, the Redis inventory, old consumers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import redis

from sluice import Client
from sluice.client.consumer import Consumer
from sluice.client.rpc import call
from sluice.v1 import (
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    offset_store_pb2,
    offset_store_pb2_grpc,
)
from tests.integration.push.conftest import PushCluster, run_push_cluster
from tests.integration.push.helpers import drain

FAST: dict[str, Any] = {"session_timeout": "5s", "fetch_max_wait": "100ms", "enable_auto_commit": False}


@pytest.fixture(scope="module")
def own() -> Iterator[PushCluster]:
    # A short linger: a subscription without consumers is unloaded (idle, known from the registry) soon.
    with run_push_cluster(dispatcher_args=("--idle-subscription-linger", "300ms")) as c:
        yield c


@pytest.fixture
def rds(own: PushCluster) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(own.redis.url)
    yield r
    r.close()


def text(raw: bytes | str) -> str:
    """A Redis reply as text. The tests' clients answer bytes (no decode_responses); redis-py's
    types also allow str."""
    assert isinstance(raw, bytes), raw
    return raw.decode()


def inventory(r: redis.Redis) -> set[str]:
    """Every key, and every field of a hash and member of a set: what a deleted topic could leak
    (group offsets live in hash fields, broadcasting members in index sets)."""
    out: set[str] = set()
    for raw in r.scan_iter(count=1000):
        key = raw.decode()
        out.add(key)
        kind = text(r.type(raw))
        if kind == "hash":
            out |= {f"{key} #{text(f)}" for f in r.hkeys(raw)}
        elif kind == "set":
            out |= {f"{key} @{text(m)}" for m in r.smembers(raw)}
        elif kind != "string":
            raise AssertionError(f"{key}: a {kind} key; teach inventory() to count inside it")
    return out


def poll_values(consumer: Consumer, n: int, timeout: float = 15.0) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {got} of {n} records arrived"
        got += [r.value or b"" for r in consumer.poll(0.2)]
    return got


def consume_as_old_group(client: Client, topic: str, group: str, n: int) -> list[bytes]:
    """Join ``group`` (earliest when nothing is committed), read ``n`` records, commit, leave."""
    c = client.consumer(group, [topic], auto_offset_reset="earliest", **FAST)
    try:
        values = poll_values(c, n)
        c.commit()
    finally:
        c.close()
    return values


def consume_as_old_subscription(client: Client, topic: str, subscription: str, n: int) -> list[bytes]:
    """Read and ack ``n`` messages of a durable subscription (earliest when it has no cursor yet)."""
    pc = client.push_consumer(topic, subscription, "exclusive", initial_position="earliest")
    try:
        return [m.value or b"" for m in drain(pc, n)]
    finally:
        pc.close()


def not_loaded(own: PushCluster, client: Client, topic: str, subscription: str) -> bool:
    try:
        own.describe(client, topic, subscription)
    except grpc.RpcError as exc:
        return exc.code() == grpc.StatusCode.NOT_FOUND
    return False


def idle_in_registry(own: PushCluster, client: Client, topic: str, subscription: str) -> bool:
    """The subscription is durable, unloaded (no consumer for longer than the linger) and still listed."""
    try:
        summary = own.describe(client, topic, subscription).summary
    except grpc.RpcError:
        return False
    return summary.durable and not summary.loaded and summary.consumers == 0


def _join(
    coordinator: coordinator_pb2_grpc.CoordinatorStub, group: str, topic: str, expr: str
) -> coordinator_pb2.GroupHeartbeatResponse:
    request = coordinator_pb2.GroupHeartbeatRequest(group=group, subscription={topic: expr})
    return call(coordinator.Heartbeat, request, timeout=10)


def _leave(
    coordinator: coordinator_pb2_grpc.CoordinatorStub,
    group: str,
    member: coordinator_pb2.GroupHeartbeatResponse,
) -> None:
    request = coordinator_pb2.GroupHeartbeatRequest(group=group, member_id=member.member_id, member_epoch=-1)
    call(coordinator.Heartbeat, request, timeout=10)


def join_track(client: Client, group: str, topic: str, expr: str) -> str:
    """The track a member reading ``topic`` with ``expr`` is given (it joins and leaves at once)."""
    coordinator = client._metadata.coordinator_stub()
    member = _join(coordinator, group, topic, expr)
    try:
        [track] = {p.track for p in member.assignment.partitions}
        return track
    finally:
        _leave(coordinator, group, member)


def split_group_with_idle_tag_b(own: PushCluster, client: Client, group: str, topic: str) -> str:
    """A ``split`` group where a tagA member committed 4 on the default track, then a tagB member was
    handed that position on a track of its own (copied offsets, handover hash), committed 6 and left,
    and so did the tagA member: both bindings idle, kept with their offsets. Returns the tagB track."""
    coordinator = client._metadata.coordinator_stub()
    store = client._channels.stub(own.offset_store.address, offset_store_pb2_grpc.OffsetStoreStub)
    topic_id = client.admin.describe_topic(topic).topic_id
    call(
        coordinator.SetGroupConfig,
        coordinator_pb2.SetGroupConfigRequest(
            group=group, config=coordinator_pb2.GroupConfig(conflict_policy="split")
        ),
        timeout=10,
    )

    def commit(member: coordinator_pb2.GroupHeartbeatResponse, track: str, offset: int) -> None:
        request = offset_store_pb2.CommitOffsetsRequest(
            group=group,
            member_id=member.member_id,
            member_epoch=member.member_epoch,
            offsets=[
                offset_store_pb2.PartitionOffset(
                    topic=topic, partition=0, offset=offset, track=track, topic_id=topic_id
                )
            ],
        )
        [result] = call(store.CommitOffsets, request, timeout=10).results
        assert result.error.code == common_pb2.NONE, result

    a = _join(coordinator, group, topic, "tagA")
    commit(a, "default", 4)
    b = _join(coordinator, group, topic, "tagB")
    [track] = {p.track for p in b.assignment.partitions}
    assert track != "default"
    commit(b, track, 6)
    _leave(coordinator, group, b)
    _leave(coordinator, group, a)
    return track


def bindings(client: Client, group: str, topic: str) -> list[coordinator_pb2.TrackBinding]:
    coordinator = client._metadata.coordinator_stub()
    described = call(coordinator.DescribeGroup, coordinator_pb2.DescribeGroupRequest(group=group), timeout=10)
    return [t for t in described.tracks if t.topic == topic]
