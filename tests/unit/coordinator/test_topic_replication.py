"""Topic replication config and per-partition controller state in the pure cluster state machine
(docs/replication.md, "Topic configuration" and "Controller state")."""

from __future__ import annotations

import json

import pytest
from coordinator_context import SETTINGS, ClusterContext

from sluice.client.metadata import TopicInfo
from sluice.coordinator.cluster.model import TopicConfig
from sluice.coordinator.cluster.records import new_topic_record
from sluice.coordinator.cluster.replication import PartitionState, ReplicationConfig, ReplicationSpec
from sluice.coordinator.cluster.state import ClusterSettings
from sluice.coordinator.convert import topic_to_proto
from sluice.errors import InvalidArgument, InvalidReplicationFactor, InvalidRequest, UnknownTopicOrPartition


def _cluster(brokers: int, default_factor: int = 1, racks: dict[int, str] | None = None) -> ClusterContext:
    settings = ClusterSettings(**{**SETTINGS.__dict__, "default_replication_factor": default_factor})
    ctx = ClusterContext(settings)
    for b in range(brokers):
        ctx.register_broker(b, rack=(racks or {}).get(b, ""))
    return ctx


def test_a_topic_without_replication_settings_is_placed_as_before() -> None:
    ctx = _cluster(3)
    topic = ctx.create_topic("orders", 4).topic
    assert topic.replication == ReplicationConfig(1, 1, False)
    record = ctx.state.topics["orders"]
    for p, state in enumerate(record.states):
        b = record.placement[p]
        assert state == PartitionState((b,), b, 0, 0, (b,))
    # Stored exactly as before replication: version 1, no new fields.
    stored = json.loads(ctx.store["topic:orders"])
    assert stored["v"] == 1
    assert "partitions" not in stored
    assert "replication" not in stored


def test_factor_three_places_every_partition_on_three_brokers_led_by_the_first() -> None:
    ctx = _cluster(3)
    result = ctx.create_topic("orders", 6, spec=ReplicationSpec(3))
    assert result.topic.replication == ReplicationConfig(3, 2, False)
    for view in result.topic.partitions:
        state = view.replica_state
        assert sorted(state.replicas) == [0, 1, 2]
        assert view.broker_id == state.leader == state.replicas[0]
        assert state.isr == state.replicas
        assert (state.leader_epoch, state.partition_epoch, state.elr) == (0, 0, ())
    # Every replica broker is told the partition, with its state (its role).
    for broker in range(3):
        refs = result.change.assign[broker]
        assert sorted(r.partition for r in refs) == list(range(6))
        assert all(r.state is not None and broker in r.state.replicas for r in refs)
        assert all(r.min_insync_replicas == 2 for r in refs)
    # Full assignments agree with the deltas.
    assert {r.partition for r in ctx.state.broker_assignment(1).assign} == set(range(6))
    # Survives a restart through the records (version 2).
    assert json.loads(ctx.store["topic:orders"])["v"] == 2
    assert ctx.recover().topics["orders"] == ctx.state.topics["orders"]


def test_the_coordinator_default_factor_applies_and_is_checked_against_live_brokers() -> None:
    ctx = _cluster(2, default_factor=3)
    with pytest.raises(InvalidReplicationFactor, match="replication factor 3 is larger than the 2 live"):
        ctx.create_topic("orders")
    assert "orders" not in ctx.state.topics
    version = ctx.state.metadata_version
    with pytest.raises(InvalidReplicationFactor):
        ctx.create_topic("orders", spec=ReplicationSpec(5))
    assert ctx.state.metadata_version == version
    two = ctx.create_topic("orders", spec=ReplicationSpec(2)).topic
    assert two.replication == ReplicationConfig(2, 2, False)


def test_dead_brokers_do_not_count_as_replicas() -> None:
    ctx = _cluster(3)
    ctx.advance(3_000)
    ctx.heartbeat(0, ctx.state.brokers[0].broker_epoch, ctx.state.metadata_version)
    ctx.heartbeat(1, ctx.state.brokers[1].broker_epoch, ctx.state.metadata_version)
    ctx.advance(3_000)  # broker 2 is silent past its session
    with pytest.raises(InvalidReplicationFactor, match="2 live broker"):
        ctx.create_topic("orders", spec=ReplicationSpec(3))


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (ReplicationSpec(2, 3), InvalidArgument),
        (ReplicationSpec(1, 2), InvalidArgument),
        (ReplicationSpec(3, -1), InvalidArgument),
        (ReplicationSpec(-1), InvalidReplicationFactor),
        (ReplicationSpec(17), InvalidReplicationFactor),
    ],
)
def test_bad_replication_settings_are_typed_errors(spec: ReplicationSpec, error: type[Exception]) -> None:
    ctx = _cluster(3)
    with pytest.raises(error):
        ctx.create_topic("orders", spec=spec)
    assert ctx.state.topics == {}


def test_min_insync_and_unclean_election_are_kept() -> None:
    ctx = _cluster(3)
    topic = ctx.create_topic("orders", spec=ReplicationSpec(3, 3, True)).topic
    assert topic.replication == ReplicationConfig(3, 3, True)
    assert ctx.recover().topics["orders"].replication == ReplicationConfig(3, 3, True)


def test_added_partitions_keep_the_topic_factor() -> None:
    ctx = _cluster(3)
    ctx.create_topic("orders", 2, spec=ReplicationSpec(2))
    before = ctx.state.topics["orders"].states
    grown = ctx.apply(ctx.state.add_partitions("orders", 5, ctx.now_ms))
    record = ctx.state.topics["orders"]
    assert record.states[:2] == before
    assert all(len(s.replicas) == 2 for s in record.states)
    assigned = {r.partition for refs in grown.change.assign.values() for r in refs}
    assert assigned == {2, 3, 4}


def test_delete_removes_the_partition_from_every_replica() -> None:
    ctx = _cluster(3)
    ctx.create_topic("orders", 2, spec=ReplicationSpec(3))
    deleted = ctx.delete_topic("orders")
    assert set(deleted.change.remove) == {0, 1, 2}


def test_racks_are_registered_and_spread_replicas() -> None:
    racks = {0: "a", 1: "a", 2: "b", 3: "b"}
    ctx = _cluster(4, racks=racks)
    assert ctx.state.brokers[2].rack == "b"
    assert ctx.recover().brokers[2].rack == "b"
    topic = ctx.create_topic("orders", 8, spec=ReplicationSpec(2)).topic
    for view in topic.partitions:
        assert {racks[b] for b in view.replica_state.replicas} == {"a", "b"}
    metadata = ctx.state.metadata([], ctx.now_ms)
    assert {b.broker_id: b.rack for b in metadata.brokers} == racks


def test_a_bad_rack_is_refused_and_a_new_rack_is_a_new_registration() -> None:
    ctx = _cluster(1)
    with pytest.raises(InvalidRequest, match="rack"):
        ctx.register_broker(5, rack="zone a")
    epoch = ctx.state.brokers[0].broker_epoch
    ctx.register_broker(0, rack="zone-b")
    assert ctx.state.brokers[0].rack == "zone-b"
    assert ctx.state.brokers[0].broker_epoch > epoch


def test_a_record_written_before_replication_reads_as_factor_one() -> None:
    ctx = _cluster(1)
    old = b'{"v":1,"name":"old","topic_id":"x","placement":[3,4],"config":{},"created_ms":5}'
    record = ctx.root.codec.decode("topic:old", old)
    assert record == new_topic_record("old", "x", [3, 4], TopicConfig(), 5)
    assert record.replication == ReplicationConfig()
    assert record.states[1] == PartitionState((4,), 4, 0, 0, (4,), ())


def test_alter_changes_min_insync_and_unclean_election_and_tells_every_replica() -> None:
    ctx = _cluster(3)
    ctx.create_topic("orders", 2, spec=ReplicationSpec(3))
    states = ctx.state.topics["orders"].states
    version = ctx.state.metadata_version
    altered = ctx.apply(ctx.state.alter_topic("orders", 3, True, ctx.now_ms))
    assert altered.topic.replication == ReplicationConfig(3, 3, True)
    assert ctx.state.metadata_version == version + 1
    assert set(altered.change.assign) == {0, 1, 2}
    assert all(r.min_insync_replicas == 3 for refs in altered.change.assign.values() for r in refs)
    # Settings of the topic, not a change of leaders or ISR: the partitions' states and epochs stay.
    assert ctx.state.topics["orders"].states == states
    # 0 / None leave a setting as it is; the record survives a restart.
    ctx.apply(ctx.state.alter_topic("orders", 0, None, ctx.now_ms))
    assert ctx.recover().topics["orders"].replication == ReplicationConfig(3, 3, True)
    ctx.apply(ctx.state.alter_topic("orders", 0, False, ctx.now_ms))
    assert ctx.state.topics["orders"].replication == ReplicationConfig(3, 3, False)


def test_alter_refuses_min_insync_above_the_factor_and_unknown_topics() -> None:
    ctx = _cluster(3)
    ctx.create_topic("orders", spec=ReplicationSpec(2))
    with pytest.raises(InvalidArgument, match=r"between 1 and the replication factor \(2\), got 3"):
        ctx.state.alter_topic("orders", 3, None, ctx.now_ms)
    with pytest.raises(InvalidArgument):
        ctx.state.alter_topic("orders", -1, None, ctx.now_ms)
    with pytest.raises(UnknownTopicOrPartition):
        ctx.state.alter_topic("nope", 1, None, ctx.now_ms)
    assert ctx.state.topics["orders"].replication == ReplicationConfig(2, 2, False)


def test_metadata_leaves_out_the_replicas_of_unreplicated_partitions_and_the_sdk_fills_them_in() -> None:
    ctx = _cluster(3)
    one = ctx.create_topic("one", 2).topic
    three = ctx.create_topic("three", 2, spec=ReplicationSpec(3)).topic
    single = topic_to_proto(one)
    assert [list(p.replicas) for p in single.partitions] == [[], []]
    info = TopicInfo.from_proto(single)
    assert all(p.replicas == p.isr == (p.broker_id,) for p in info.partitions)
    assert (info.replication_factor, info.min_insync_replicas) == (1, 1)
    replicated = TopicInfo.from_proto(topic_to_proto(three))
    assert replicated.replication_factor == 3
    for p, view in zip(replicated.partitions, three.partitions, strict=True):
        assert p.replicas == view.replica_state.replicas
        assert p.isr == view.replica_state.isr
        assert p.broker_id == p.replicas[0]
