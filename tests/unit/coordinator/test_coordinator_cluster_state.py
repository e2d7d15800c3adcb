"""The pure cluster state machine, driven through ClusterContext with a fake clock (no network, no Redis)."""

from __future__ import annotations

from collections import Counter

import pytest
from coordinator_context import ClusterContext, durable

from sluice.coordinator.cluster.model import Endpoint, PartitionRef, TopicConfig
from sluice.coordinator.cluster.placement import place_partitions
from sluice.coordinator.cluster.records import TopicRecord
from sluice.coordinator.cluster.sessions import Liveness
from sluice.coordinator.cluster.state import ClusterState
from sluice.errors import (
    BrokerNotAvailable,
    FencedMemberEpoch,
    InvalidArgument,
    InvalidPartitions,
    InvalidRequest,
    InvalidTopic,
    TopicAlreadyExists,
    UnknownMember,
    UnknownTopicOrPartition,
)

# ---- brokers ----------------------------------------------------------------------------------


def test_broker_epochs_increase_and_reregistration_with_same_incarnation_is_idempotent() -> None:
    ctx = ClusterContext()
    first = ctx.register_broker(1)
    second = ctx.register_broker(2)
    assert (first.epoch, second.epoch) == (1, 2)
    assert first.new_incarnation
    assert first.change is not None
    assert (first.heartbeat_interval_ms, first.session_timeout_ms) == (1_000, 5_000)
    version = ctx.state.metadata_version

    again = ctx.register_broker(1)
    assert again.epoch == 1
    assert not again.new_incarnation
    assert again.change is None
    assert ctx.state.metadata_version == version

    restarted = ctx.register_broker(1, incarnation="i2")
    assert restarted.epoch == 3
    assert restarted.new_incarnation
    # A restart in place does not change what Metadata answers, so no new metadata version.
    assert restarted.change is None
    assert ctx.state.metadata_version == version

    moved = ctx.register_broker(1, port=9999, incarnation="i3")
    assert moved.epoch == 4
    assert moved.change is not None
    assert ctx.state.metadata_version == version + 1
    assert ctx.state.brokers[1].endpoint == Endpoint("127.0.0.1", 9999)


@pytest.mark.parametrize(
    ("broker_id", "endpoint", "incarnation"),
    [
        (-1, Endpoint("h", 1), "i"),
        (1, Endpoint("", 1), "i"),
        (1, Endpoint("h", 0), "i"),
        (1, Endpoint("h", 70000), "i"),
        (1, Endpoint("h", 1), ""),
    ],
)
def test_register_broker_rejects_bad_input(broker_id: int, endpoint: Endpoint, incarnation: str) -> None:
    ctx = ClusterContext()
    with pytest.raises(InvalidRequest):
        ctx.state.register_broker(broker_id, endpoint, incarnation, ctx.now_ms)
    assert ctx.state.brokers == {}


def test_heartbeat_from_unknown_broker_or_stale_epoch_is_a_typed_error() -> None:
    ctx = ClusterContext()
    unknown = ctx.heartbeat(7, 1, 0)
    assert isinstance(unknown.error, UnknownMember)
    assert "RegisterBroker" in unknown.error.message

    old = ctx.register_broker(1, incarnation="a")
    new = ctx.register_broker(1, incarnation="b")
    stale = ctx.heartbeat(1, old.epoch, ctx.state.metadata_version)
    assert isinstance(stale.error, FencedMemberEpoch)
    assert stale.update is None
    assert ctx.heartbeat(1, new.epoch, ctx.state.metadata_version).error is None


def test_heartbeat_returns_the_full_assignment_whenever_the_broker_is_behind() -> None:
    ctx = ClusterContext()
    reg1 = ctx.register_broker(1)
    ctx.register_broker(2)
    ctx.create_topic("a", 4)
    ctx.create_topic("b", 3)
    version = ctx.state.metadata_version

    behind = ctx.heartbeat(1, reg1.epoch, 0)
    assert behind.error is None
    assert behind.update is not None
    assert behind.update.full
    assert behind.update.metadata_version == version
    mine = {(r.topic, r.partition) for r in behind.update.assign}
    expected = {(t.name, p) for t in ctx.state.topics.values() for p, b in enumerate(t.placement) if b == 1}
    assert mine == expected
    assert mine
    assert all(r.topic_id == ctx.state.topics[r.topic].topic_id for r in behind.update.assign)

    current = ctx.heartbeat(1, reg1.epoch, version)
    assert current.update is None
    assert current.error is None


def test_a_broker_ahead_of_the_coordinator_moves_the_version_past_it() -> None:
    # Brokers only apply newer versions; if our metadata was rolled back we must jump past them.
    ctx = ClusterContext()
    reg = ctx.register_broker(1)
    res = ctx.heartbeat(1, reg.epoch, 41)
    assert res.update is not None
    assert res.update.metadata_version == 42
    assert res.change is not None
    assert res.change.version == 42
    assert ctx.state.metadata_version == 42
    assert ctx.recover().metadata_version == 42


def test_liveness_expires_after_the_session_timeout_and_a_heartbeat_revives() -> None:
    ctx = ClusterContext()
    reg = ctx.register_broker(1)
    ctx.register_broker(2)
    ctx.advance(3_000)
    ctx.heartbeat(2, 2, ctx.state.metadata_version)
    ctx.advance(2_500)  # broker 1 silent 5.5 s > 5 s; broker 2 silent 2.5 s
    assert ctx.expired == [1]
    assert ctx.state.live_brokers(ctx.now_ms) == [2]
    assert ctx.state.broker_liveness(1, ctx.now_ms) is Liveness.EXPIRED
    alive = {b.broker_id: b.alive for b in ctx.state.metadata([], ctx.now_ms).brokers}
    assert alive == {1: False, 2: True}

    # New partitions only go to live brokers.
    topic = ctx.create_topic("t", 4).topic
    assert {p.broker_id for p in topic.partitions} == {2}

    ctx.heartbeat(1, reg.epoch, ctx.state.metadata_version)
    assert ctx.state.live_brokers(ctx.now_ms) == [1, 2]


def test_liveness_is_answered_truthfully_even_before_the_timer_sweeps() -> None:
    ctx = ClusterContext()
    ctx.register_broker(1)
    ctx.now_ms += 5_001  # no advance(): the sweep has not run
    assert ctx.state.live_brokers(ctx.now_ms) == []


def test_recovered_brokers_are_not_alive_until_they_heartbeat() -> None:
    ctx = ClusterContext()
    reg = ctx.register_broker(1)
    recovered = ctx.recover()
    assert recovered.brokers == ctx.state.brokers
    assert recovered.live_brokers(ctx.now_ms) == []
    assert recovered.broker_liveness(1, ctx.now_ms) is Liveness.UNKNOWN
    # The persisted epoch is still valid after a restart: no re-registration needed.
    assert recovered.broker_heartbeat(1, reg.epoch, 0, ctx.now_ms).response.error is None
    assert recovered.live_brokers(ctx.now_ms) == [1]


# ---- topics ----------------------------------------------------------------------------------


def test_create_topic_with_no_live_broker_says_what_to_do() -> None:
    ctx = ClusterContext()
    with pytest.raises(BrokerNotAvailable, match="no broker has registered"):
        ctx.create_topic("t")
    ctx.register_broker(3)
    ctx.advance(6_000)
    with pytest.raises(BrokerNotAvailable, match=r"broker 3 at 127\.0\.0\.1:9003: last heartbeat 6\.0s ago"):
        ctx.create_topic("t")


@pytest.mark.parametrize("name", ["", "a b", "x" * 250, ".", "..", "tópico", "a/b"])
def test_create_topic_rejects_invalid_names(name: str) -> None:
    ctx = ClusterContext()
    ctx.register_broker(1)
    with pytest.raises(InvalidTopic):
        ctx.create_topic(name)


@pytest.mark.parametrize("partitions", [0, -1, 10_001])
def test_create_topic_rejects_partitions_out_of_range(partitions: int) -> None:
    ctx = ClusterContext()
    ctx.register_broker(1)
    with pytest.raises(InvalidPartitions, match="between 1 and 10000"):
        ctx.create_topic("t", partitions)


def test_create_topic_accepts_the_partition_bounds() -> None:
    ctx = ClusterContext()
    ctx.register_broker(1)
    assert len(ctx.create_topic("one", 1).topic.partitions) == 1
    assert len(ctx.create_topic("many", 10_000).topic.partitions) == 10_000


def test_create_topic_rejects_duplicates_and_negative_config() -> None:
    ctx = ClusterContext()
    ctx.register_broker(1)
    ctx.create_topic("t", 2)
    with pytest.raises(TopicAlreadyExists, match="already exists with 2 partitions"):
        ctx.create_topic("t", 5)
    with pytest.raises(InvalidArgument, match="retention_ms"):
        ctx.create_topic("u", 1, TopicConfig(retention_ms=-1))


def test_handlers_do_not_change_durable_state_until_replayed() -> None:
    ctx = ClusterContext()
    ctx.register_broker(1)
    before = durable(ctx.state)
    result = ctx.state.create_topic("t", 3, TopicConfig(), "id", ctx.now_ms)
    assert durable(ctx.state) == before
    assert len(result.records) == 2
    ctx.apply(result)
    assert "t" in ctx.state.topics
    deleted = ctx.state.delete_topic("t")
    assert "t" in ctx.state.topics
    ctx.apply(deleted)
    assert "t" not in ctx.state.topics


def test_create_topic_change_lists_each_brokers_new_partitions() -> None:
    ctx = ClusterContext()
    for b in (1, 2, 3):
        ctx.register_broker(b)
    base = ctx.state.metadata_version
    res = ctx.create_topic("orders", 4, TopicConfig(retention_ms=60_000))
    assert (res.change.base_version, res.change.version) == (base, base + 1)
    assert ctx.state.metadata_version == base + 1
    placement = ctx.state.topics["orders"].placement
    assert placement == (3, 1, 2, 3)  # the worked example in place_partitions' docstring
    assert res.change.assign[3] == (
        PartitionRef("orders", 0, "id-1", TopicConfig(retention_ms=60_000)),
        PartitionRef("orders", 3, "id-1", TopicConfig(retention_ms=60_000)),
    )
    assert res.change.delta_for(2).assign == (PartitionRef("orders", 2, "id-1", TopicConfig()),)
    assert res.change.delta_for(9).assign == ()  # unaffected: an empty delta at the new version
    assert res.change.delta_for(9).metadata_version == base + 1


def test_delete_topic_removes_and_lists_removed_partitions_per_broker() -> None:
    ctx = ClusterContext()
    ctx.register_broker(1)
    ctx.register_broker(2)
    ctx.create_topic("t", 4)
    topic_id = ctx.state.topics["t"].topic_id
    res = ctx.delete_topic("t")
    assert sorted(r.partition for refs in res.change.remove.values() for r in refs) == [0, 1, 2, 3]
    assert all(r.topic_id == topic_id for refs in res.change.remove.values() for r in refs)
    assert "t" not in ctx.state.topics
    with pytest.raises(UnknownTopicOrPartition):
        ctx.delete_topic("t")
    with pytest.raises(UnknownTopicOrPartition):
        ctx.state.describe_topic("t", ctx.now_ms)
    with pytest.raises(InvalidTopic):
        ctx.delete_topic("no such/topic")
    # A recreated topic is a new incarnation: a new topic_id, so brokers can tell them apart.
    assert ctx.create_topic("t", 1).topic.topic_id != topic_id


def test_metadata_version_increases_with_every_change() -> None:
    ctx = ClusterContext()
    versions = [ctx.state.metadata_version]
    ctx.register_broker(1)
    versions.append(ctx.state.metadata_version)
    ctx.create_topic("a")
    versions.append(ctx.state.metadata_version)
    ctx.create_topic("b")
    versions.append(ctx.state.metadata_version)
    ctx.delete_topic("a")
    versions.append(ctx.state.metadata_version)
    ctx.register_dispatcher("d1")
    versions.append(ctx.state.metadata_version)
    assert versions == sorted(set(versions))
    assert versions == list(range(6))


# ---- placement ----------------------------------------------------------------------------------


def test_placement_is_deterministic_balanced_and_spread_over_topics() -> None:
    brokers = [5, 1, 3]
    assert place_partitions("orders", 7, brokers) == place_partitions("orders", 7, [3, 5, 1])
    counts = Counter(place_partitions("orders", 7, brokers))
    assert max(counts.values()) - min(counts.values()) <= 1
    # Different topics start at different brokers, so single-partition topics spread out.
    starts = Counter(place_partitions(f"topic-{i}", 1, brokers)[0] for i in range(60))
    assert set(starts) == {1, 3, 5}
    assert min(starts.values()) >= 10


def test_same_history_gives_the_same_placement() -> None:
    def run() -> dict[str, tuple[int, ...]]:
        ctx = ClusterContext()
        for b in (4, 2, 9):
            ctx.register_broker(b)
        for i in range(10):
            ctx.create_topic(f"t{i}", i + 1)
        return {name: t.placement for name, t in ctx.state.topics.items()}

    assert run() == run()


# ---- dispatchers ----------------------------------------------------------------------------------


def test_dispatcher_routing_is_consistent_and_moves_little_when_one_joins() -> None:
    ctx = ClusterContext()
    ctx.register_broker(1)
    ctx.create_topic("t", 60)
    assert {p.dispatcher_id for p in ctx.state.describe_topic("t", ctx.now_ms).partitions} == {""}
    ctx.register_dispatcher("d1", 8001)
    ctx.register_dispatcher("d2", 8002)
    before = [p.dispatcher_id for p in ctx.state.describe_topic("t", ctx.now_ms).partitions]
    assert set(before) == {"d1", "d2"}
    assert before == [p.dispatcher_id for p in ctx.state.describe_topic("t", ctx.now_ms).partitions]

    ctx.register_dispatcher("d3", 8003)
    after = [p.dispatcher_id for p in ctx.state.describe_topic("t", ctx.now_ms).partitions]
    moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    # Rendezvous hashing: only partitions the newcomer wins move, and all of them move to it.
    assert moved
    assert all(after[i] == "d3" for i in moved)
    assert 5 <= len(moved) <= 35


def test_dead_dispatchers_get_no_partitions_and_reregistration_is_their_heartbeat() -> None:
    ctx = ClusterContext()
    ctx.register_broker(1)
    ctx.create_topic("t", 8)
    reg = ctx.register_dispatcher("d1", 8001)
    ctx.register_dispatcher("d2", 8002)
    ctx.advance(3_000)
    again = ctx.register_dispatcher("d1", 8001)  # same incarnation: idempotent heartbeat
    assert again.epoch == reg.epoch
    assert not again.new_incarnation
    ctx.advance(3_000)  # d2 silent 6 s
    meta = ctx.state.metadata([], ctx.now_ms)
    assert {d.dispatcher_id: d.alive for d in meta.dispatchers} == {"d1": True, "d2": False}
    assert {p.dispatcher_id for p in meta.topics[0].partitions} == {"d1"}


def test_register_dispatcher_validates_its_id() -> None:
    ctx = ClusterContext()
    with pytest.raises(InvalidArgument):
        ctx.register_dispatcher("bad id")


# ---- metadata and replay -----------------------------------------------------------------------------


def test_metadata_lists_requested_topics_and_unknown_ones() -> None:
    ctx = ClusterContext()
    ctx.register_broker(1)
    ctx.create_topic("b", 2)
    ctx.create_topic("a", 1)
    everything = ctx.state.metadata([], ctx.now_ms)
    assert [t.name for t in everything.topics] == ["a", "b"]
    assert everything.metadata_version == ctx.state.metadata_version
    some = ctx.state.metadata(["b", "zz", "b"], ctx.now_ms)
    assert [t.name for t in some.topics] == ["b"]
    assert some.unknown_topics == ("zz",)
    with pytest.raises(InvalidTopic):
        ctx.state.metadata(["bad name"], ctx.now_ms)


def test_replaying_the_stored_records_reproduces_the_state() -> None:
    ctx = ClusterContext()
    for b in (1, 2, 3):
        ctx.register_broker(b)
    ctx.register_broker(2, incarnation="again")
    ctx.register_dispatcher("d1")
    for i in range(5):
        ctx.create_topic(f"t{i}", 3 + i, TopicConfig(segment_bytes=1024 * (i + 1)))
    ctx.delete_topic("t1")
    ctx.delete_topic("t3")
    ctx.create_topic("t1", 2)

    recovered = ctx.recover()
    assert durable(recovered) == durable(ctx.state)

    def placement(state: ClusterState) -> list[tuple[str, str, list[int], TopicConfig]]:
        return [
            (t.name, t.topic_id, [p.broker_id for p in t.partitions], t.config)
            for t in state.list_topics(ctx.now_ms)
        ]

    assert placement(recovered) == placement(ctx.state)
    # Epochs keep increasing after recovery (no reuse).
    assert recovered.register_broker(4, Endpoint("h", 1), "x", ctx.now_ms).response.epoch == 5
    # The compacted store holds one record per live key and none for deleted topics.
    assert sorted(k for k in ctx.store if k.startswith("topic:")) == [
        "topic:t0",
        "topic:t1",
        "topic:t2",
        "topic:t4",
    ]


def test_recovery_replay_order_does_not_matter_for_the_result() -> None:
    ctx = ClusterContext()
    ctx.register_broker(1)
    ctx.create_topic("x", 3)
    records = [ctx.root.codec.decode(f, v) for f, v in ctx.store.items()]
    forward = ClusterContext()
    forward.root.replay_all(records)
    backward = ClusterContext()
    backward.root.replay_all(list(reversed(records)))
    assert durable(forward.state) == durable(backward.state) == durable(ctx.state)
    assert isinstance(forward.state.topics["x"], TopicRecord)
