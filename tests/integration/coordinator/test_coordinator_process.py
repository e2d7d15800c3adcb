"""The real ``sluice coordinator`` process on loopback with a private Redis, driven through gRPC stubs."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import pytest
import redis
from tests.harness import RedisServer, run_redis
from tests.integration.coordinator.coordinator_peers import (
    Coordinator,
    call,
    coordinator_stub,
    peer_broker,
    run_coordinator,
    typed_error,
)

from sluice.errors import (
    BrokerNotAvailable,
    FencedMemberEpoch,
    InvalidPartitions,
    InvalidRequest,
    InvalidTopic,
    NotCoordinator,
    StorageError,
    TopicAlreadyExists,
    UnknownMember,
    UnknownTopicOrPartition,
)
from sluice.v1 import broker_pb2, common_pb2, coordinator_pb2_grpc
from sluice.v1 import coordinator_pb2 as pb


def coordinator_args(redis_url: str, *extra: str) -> tuple[str, ...]:
    return ("--port", "0", "--metrics-port", "0", "--redis-url", redis_url, *extra)


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    with run_redis() as r:
        yield r


@pytest.fixture(scope="module")
def coordinator(private_redis: RedisServer) -> Iterator[Coordinator]:
    with run_coordinator(*coordinator_args(private_redis.url, "--key-prefix", "shared")) as c:
        yield c


def describe(stub: coordinator_pb2_grpc.CoordinatorStub, name: str) -> pb.TopicDescription:
    return call(stub.DescribeTopic, pb.DescribeTopicRequest(name=name)).topic


# ---- topics ----------------------------------------------------------------------------------


def test_topic_lifecycle_and_pushes_to_brokers(coordinator: Coordinator) -> None:
    with (
        coordinator_stub(coordinator.address) as stub,
        peer_broker(11, delay_s=0.2) as b1,
        peer_broker(12) as b2,
    ):
        b1.register(stub)
        b2.register(stub)
        b1.heartbeat(stub)
        b2.heartbeat(stub)

        started = time.monotonic()
        created = call(
            stub.CreateTopic,
            pb.CreateTopicRequest(
                name="life", partitions=4, config=broker_pb2.TopicConfig(retention_ms=60_000)
            ),
        ).topic
        # CreateTopic returned only after the (slow) broker acknowledged its new partitions.
        assert time.monotonic() - started >= 0.2
        on_b1 = {(a.topic, a.partition) for a in b1.received[-1].assign}
        placed = {p.partition: p.broker_id for p in created.partitions}
        assert on_b1 == {("life", p) for p, b in placed.items() if b == 11}
        assert on_b1
        live = {b.broker_id for b in call(stub.Metadata, pb.MetadataRequest()).brokers if b.alive}
        assert set(placed.values()) <= live
        assert 12 in placed.values()
        assert created.topic_id
        assert created.config.retention_ms == 60_000
        assert all(a.topic_id == created.topic_id for a in b1.received[-1].assign)
        assert b2.wait_for_version(b1.version)
        assert set(b2.partitions) == {("life", p) for p, b in placed.items() if b == 12}

        listed = call(stub.ListTopics, pb.ListTopicsRequest()).topics
        assert "life" in [t.name for t in listed]
        assert describe(stub, "life") == created

        meta = call(stub.Metadata, pb.MetadataRequest(topics=["life", "nope"]))
        assert [t.name for t in meta.topics] == ["life"]
        assert list(meta.unknown_topics) == ["nope"]
        brokers = {b.broker_id: (b.endpoint.port, b.alive) for b in meta.brokers}
        assert brokers[11] == (b1.port, True)
        assert brokers[12] == (b2.port, True)
        assert meta.coordinator.port == coordinator.port
        assert meta.metadata_version == b1.version

        call(stub.DeleteTopic, pb.DeleteTopicRequest(name="life"))
        removal = b1.received[-1]
        assert not removal.full
        assert {(r.topic, r.partition) for r in removal.remove} == on_b1
        assert not any(t == "life" for t, _ in b1.partitions)
        assert "life" not in [t.name for t in call(stub.ListTopics, pb.ListTopicsRequest()).topics]
        err, _ = typed_error(stub.DescribeTopic, pb.DescribeTopicRequest(name="life"))
        assert isinstance(err, UnknownTopicOrPartition)


def test_bad_input_gets_typed_errors_with_the_error_code_trailer(coordinator: Coordinator) -> None:
    with coordinator_stub(coordinator.address) as stub, peer_broker(21) as b:
        b.register(stub)
        call(stub.CreateTopic, pb.CreateTopicRequest(name="dup", partitions=1))
        cases = [
            (stub.CreateTopic, pb.CreateTopicRequest(name="bad name", partitions=1), InvalidTopic),
            (stub.CreateTopic, pb.CreateTopicRequest(name="x" * 250, partitions=1), InvalidTopic),
            (stub.CreateTopic, pb.CreateTopicRequest(name="zero", partitions=0), InvalidPartitions),
            (stub.CreateTopic, pb.CreateTopicRequest(name="huge", partitions=10_001), InvalidPartitions),
            (stub.CreateTopic, pb.CreateTopicRequest(name="dup", partitions=1), TopicAlreadyExists),
            (stub.DeleteTopic, pb.DeleteTopicRequest(name="never-created"), UnknownTopicOrPartition),
            (stub.DescribeTopic, pb.DescribeTopicRequest(name="never-created"), UnknownTopicOrPartition),
            (stub.DescribeTopic, pb.DescribeTopicRequest(name=""), InvalidTopic),
            (stub.Metadata, pb.MetadataRequest(topics=["ok", "not/ok"]), InvalidTopic),
            (stub.RegisterBroker, pb.RegisterBrokerRequest(broker_id=5, incarnation="i"), InvalidRequest),
        ]
        for method, request, expected in cases:
            err, trailer = typed_error(method, request)
            assert type(err) is expected, (request, err)
            assert trailer == str(expected.code)
            assert err.message  # a message a person can act on
        assert "between 1 and 10000" in typed_error(stub.CreateTopic, cases[2][1])[0].message
        # Nothing of the above was created, and the service still answers.
        names = [t.name for t in call(stub.ListTopics, pb.ListTopicsRequest()).topics]
        assert "zero" not in names
        assert "huge" not in names
        assert "dup" in names


def test_group_rpcs_are_served(coordinator: Coordinator) -> None:
    # The protocol itself is tested in tests/integration/coordinator_groups.
    with coordinator_stub(coordinator.address) as stub:
        assert isinstance(stub.ListGroups(pb.ListGroupsRequest(), timeout=5), pb.ListGroupsResponse)


def test_heartbeat_reconciles_a_broker_that_is_behind(coordinator: Coordinator) -> None:
    with coordinator_stub(coordinator.address) as stub, peer_broker(31) as b:
        b.register(stub)
        # Other tests' brokers may still count as alive here: enough partitions that some land on 31.
        call(stub.CreateTopic, pb.CreateTopicRequest(name="recon-a", partitions=12))
        call(stub.CreateTopic, pb.CreateTopicRequest(name="recon-b", partitions=12))
        current = call(stub.Metadata, pb.MetadataRequest(topics=["recon-a"])).metadata_version
        mine = {
            (t.name, p.partition)
            for t in call(stub.ListTopics, pb.ListTopicsRequest()).topics
            for p in t.partitions
            if p.broker_id == 31
        }
        assert {t for t, _ in mine} == {"recon-a", "recon-b"}

        # A broker that lost its state (version 0) gets its complete assignment back.
        response = call(
            stub.BrokerHeartbeat,
            pb.BrokerHeartbeatRequest(broker_id=31, broker_epoch=b.epoch, metadata_version=0),
        )
        assert not response.HasField("error")
        assert response.update.full
        assert response.update.metadata_version == current
        assert {(a.topic, a.partition) for a in response.update.assign} == mine
        # Up to date: nothing to send.
        response = call(
            stub.BrokerHeartbeat,
            pb.BrokerHeartbeatRequest(broker_id=31, broker_epoch=b.epoch, metadata_version=current),
        )
        assert not response.HasField("update")
        assert not response.HasField("error")

        # Unknown broker, stale epoch: a typed error in the response; the broker registers again.
        response = call(stub.BrokerHeartbeat, pb.BrokerHeartbeatRequest(broker_id=999, broker_epoch=1))
        assert response.error.code == UnknownMember.code
        assert "RegisterBroker" in response.error.message
        response = call(
            stub.BrokerHeartbeat, pb.BrokerHeartbeatRequest(broker_id=31, broker_epoch=b.epoch + 100)
        )
        assert response.error.code == FencedMemberEpoch.code
        assert not response.HasField("update")


def test_metrics_are_exported(coordinator: Coordinator) -> None:
    with coordinator_stub(coordinator.address) as stub, peer_broker(41) as b:
        b.register(stub)
        call(stub.CreateTopic, pb.CreateTopicRequest(name="metered", partitions=3))
    with urllib.request.urlopen(f"http://{coordinator.metrics}/metrics", timeout=5) as response:
        text = response.read().decode()
    values = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith("sluice_coordinator_") and " " in line
    }
    assert values["sluice_coordinator_topics"] >= 1
    assert values["sluice_coordinator_partitions"] >= 3
    assert values["sluice_coordinator_brokers_alive"] >= 1
    assert values["sluice_coordinator_metadata_version"] >= 2
    assert 'sluice_coordinator_rpc_requests_total{code="OK",method="CreateTopic"}' in values


# ---- restarts, fencing, liveness ---------------------------------------------------------------------


def snapshot(stub: coordinator_pb2_grpc.CoordinatorStub) -> tuple[list[pb.TopicDescription], int]:
    topics = list(call(stub.ListTopics, pb.ListTopicsRequest()).topics)
    version = call(stub.Metadata, pb.MetadataRequest()).metadata_version
    return topics, version


def test_restart_after_terminate_and_after_kill_keeps_topics_placement_and_version() -> None:
    with run_redis() as r, peer_broker(1) as b1, peer_broker(2) as b2:
        with run_coordinator(*coordinator_args(r.url)) as c:
            with coordinator_stub(c.address) as stub:
                b1.register(stub)
                b2.register(stub)
                for i in range(4):
                    call(stub.CreateTopic, pb.CreateTopicRequest(name=f"keep-{i}", partitions=i + 2))
                call(stub.DeleteTopic, pb.DeleteTopicRequest(name="keep-1"))
                before = snapshot(stub)
            assert [t.name for t in before[0]] == ["keep-0", "keep-2", "keep-3"]

            for kill in (False, True):
                code = c.stop(kill=kill)
                assert kill or code == 0
                c.restart()
                with coordinator_stub(c.address) as stub:
                    assert snapshot(stub) == before, f"state changed across a restart (kill={kill})"
                    # Broker epochs survive too: the brokers keep heartbeating without re-registering.
                    assert not b1.heartbeat(stub).HasField("error")
                    # And the next change continues the version sequence.
                    call(stub.CreateTopic, pb.CreateTopicRequest(name=f"after-{kill}", partitions=1))
                    assert call(stub.Metadata, pb.MetadataRequest()).metadata_version == before[1] + 1
                    call(stub.DeleteTopic, pb.DeleteTopicRequest(name=f"after-{kill}"))
                    before = snapshot(stub)
        # Every start took a new coordinator epoch (the fencing token).
        with redis.Redis.from_url(r.url) as client:
            assert int(client.get("sluice:coordinator:epoch") or 0) == 3


def test_a_superseded_coordinator_cannot_write() -> None:
    with run_redis() as r, peer_broker(1) as b, run_coordinator(*coordinator_args(r.url)) as old:
        with coordinator_stub(old.address) as stub:
            b.register(stub)
            call(stub.CreateTopic, pb.CreateTopicRequest(name="before", partitions=1))
        with run_coordinator(*coordinator_args(r.url)) as new:
            with coordinator_stub(old.address) as stub:
                err, trailer = typed_error(
                    stub.CreateTopic, pb.CreateTopicRequest(name="zombie", partitions=1)
                )
                assert isinstance(err, NotCoordinator)
                assert err.retriable
                assert trailer == str(common_pb2.NOT_COORDINATOR)
            with coordinator_stub(new.address) as stub:
                b.register(stub)
                names = [t.name for t in call(stub.ListTopics, pb.ListTopicsRequest()).topics]
                assert names == ["before"]
                call(stub.CreateTopic, pb.CreateTopicRequest(name="after", partitions=1))


def test_a_silent_broker_is_marked_not_alive_and_gets_no_new_partitions() -> None:
    timeouts = ("--broker-session-timeout", "800ms", "--broker-heartbeat-interval", "200ms")
    with (
        run_redis() as r,
        peer_broker(1) as b1,
        peer_broker(2) as b2,
        run_coordinator(*coordinator_args(r.url, *timeouts)) as c,
        coordinator_stub(c.address) as stub,
    ):
        assert b1.register(stub).session_timeout_ms == 800
        b2.register(stub)
        deadline = time.monotonic() + 1.2
        while time.monotonic() < deadline:  # b2 heartbeats, b1 stays silent
            b2.heartbeat(stub)
            time.sleep(0.2)
        alive = {b.broker_id: b.alive for b in call(stub.Metadata, pb.MetadataRequest()).brokers}
        assert alive == {1: False, 2: True}
        topic = call(stub.CreateTopic, pb.CreateTopicRequest(name="only-live", partitions=4)).topic
        assert {p.broker_id for p in topic.partitions} == {2}

        time.sleep(1.0)  # now both silent
        err, _ = typed_error(stub.CreateTopic, pb.CreateTopicRequest(name="nobody", partitions=1))
        assert isinstance(err, BrokerNotAvailable)
        assert "last heartbeat" in err.message
        # A heartbeat with the still-valid epoch brings the broker back.
        assert not b1.heartbeat(stub).HasField("error")
        call(stub.CreateTopic, pb.CreateTopicRequest(name="nobody", partitions=1))


def test_a_redis_outage_is_a_retriable_typed_error_and_loses_nothing() -> None:
    with run_redis() as r, peer_broker(1) as b, run_coordinator(*coordinator_args(r.url)) as c:
        with coordinator_stub(c.address) as stub:
            b.register(stub)
            call(stub.CreateTopic, pb.CreateTopicRequest(name="kept", partitions=2))
            r.kill()
            err, _ = typed_error(stub.CreateTopic, pb.CreateTopicRequest(name="during", partitions=1))
            assert isinstance(err, StorageError)
            assert err.retriable
            # Reads are served from memory meanwhile.
            assert [t.name for t in call(stub.ListTopics, pb.ListTopicsRequest()).topics] == ["kept"]
            r.restart()
            call(stub.CreateTopic, pb.CreateTopicRequest(name="after", partitions=1))
            names = [t.name for t in call(stub.ListTopics, pb.ListTopicsRequest()).topics]
            assert names == ["after", "kept"]
        c.stop(kill=True)
        c.restart()
        with coordinator_stub(c.address) as stub:
            names = [t.name for t in call(stub.ListTopics, pb.ListTopicsRequest()).topics]
            assert names == ["after", "kept"]
