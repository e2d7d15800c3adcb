"""Joining, heartbeats, leaving, static membership, session expiry, fencing, errors (pure machine)."""

from __future__ import annotations

import pytest

from sluice.coordinator.groups.model import GroupState, HeartbeatRequest, MessageModel
from sluice.errors import (
    FencedMemberEpoch,
    InvalidArgument,
    InvalidFilter,
    InvalidRequest,
    UnknownAssignor,
    UnknownMember,
    UnknownTopicOrPartition,
)

from .groups_context import GroupsContext, durable, tps


@pytest.fixture
def ctx() -> GroupsContext:
    c = GroupsContext()
    c.create_topic("t", 4)
    return c


def test_a_member_joins_gets_an_id_an_epoch_and_every_partition(ctx: GroupsContext) -> None:
    r = ctx.heartbeat()
    assert r.error is None
    assert r.member_id == "m001"
    assert r.member_epoch == 1
    assert r.heartbeat_interval_ms == 1_000
    assert tps(r) == {("t", p) for p in range(4)}
    assert {a.track for a in r.assignment or ()} == {"default"}
    assert ctx.owners_in_redis() == {f"t/{p}": "m001" for p in range(4)}
    assert ctx.redis["sluice:grp:{g}:members"] == {"m001": "1"}
    assert ctx.redis["sluice:grp:{g}:live"] == "1"
    ctx.check_redis_matches_state()


def test_a_steady_heartbeat_writes_nothing_and_sends_no_assignment(ctx: GroupsContext) -> None:
    r = ctx.heartbeat()
    owned = tps(r)
    writes = ctx.writes
    for _ in range(5):
        again = ctx.heartbeat(member_id=r.member_id, epoch=r.member_epoch, owned=owned)
        assert again.error is None
        assert again.assignment is None
        assert again.member_epoch == r.member_epoch
    assert ctx.writes == writes
    request = HeartbeatRequest(
        "g", r.member_id, r.member_epoch, subscription={"t": "*"}, owned=frozenset(owned)
    )
    assert ctx.records_of(request) == 0


def test_a_second_member_gets_partitions_only_after_the_first_releases_them(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    b = ctx.heartbeat()
    assert b.member_epoch == 2
    assert tps(b) == set()  # everything still belongs to a
    assert b.heartbeat_interval_ms == 100  # waiting for partitions: heartbeat sooner
    a2 = ctx.heartbeat(member_id=a.member_id, epoch=a.member_epoch, owned=tps(a))
    kept = tps(a2)
    assert len(kept) == 2
    assert a2.member_epoch == 1  # epoch moves only after releasing
    assert ctx.groups.groups["g"].state() is GroupState.RECONCILING
    # b asks again: a has not released yet, still nothing.
    assert ctx.heartbeat(member_id=b.member_id, epoch=2).assignment is None
    a3 = ctx.heartbeat(member_id=a.member_id, epoch=1, owned=kept)
    assert a3.member_epoch == 2
    b3 = ctx.heartbeat(member_id=b.member_id, epoch=2)
    assert tps(b3) == {("t", p) for p in range(4)} - kept
    assert ctx.groups.groups["g"].state() is GroupState.STABLE
    ctx.check_redis_matches_state()


def test_partial_release_frees_each_partition_at_once(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    b = ctx.heartbeat()
    a2 = ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(a))
    revoked = sorted(tps(a) - tps(a2))
    # a releases one of the two partitions it must give up.
    ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(a2) | {revoked[1]})
    b2 = ctx.heartbeat(member_id=b.member_id, epoch=2)
    assert tps(b2) == {revoked[0]}
    assert ctx.owners_in_redis()[f"t/{revoked[1][1]}"] == a.member_id
    ctx.check_redis_matches_state()


def test_leave_hands_partitions_over_at_once(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    b = ctx.heartbeat()
    left = ctx.heartbeat(member_id=a.member_id, epoch=-1)
    assert left.member_epoch == -1
    assert left.error is None
    b2 = ctx.heartbeat(member_id=b.member_id, epoch=b.member_epoch)
    assert tps(b2) == {("t", p) for p in range(4)}
    assert "m001" not in ctx.redis["sluice:grp:{g}:members"]  # type: ignore[operator]
    assert ctx.redis["sluice:grp:{g}:live"] == "1"
    again = ctx.heartbeat(member_id=a.member_id, epoch=1)
    assert isinstance(again.error, UnknownMember)


def test_leave_group_rpc_and_its_errors(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    with pytest.raises(FencedMemberEpoch):
        ctx.apply(ctx.groups.leave("g", a.member_id, 7, ctx.now_ms))
    ctx.apply(ctx.groups.leave("g", a.member_id, -1, ctx.now_ms))
    with pytest.raises(UnknownMember):
        ctx.apply(ctx.groups.leave("g", a.member_id, -1, ctx.now_ms))
    assert ctx.groups.groups["g"].state() is GroupState.EMPTY


def test_static_member_restart_keeps_its_id_and_partitions(ctx: GroupsContext) -> None:
    a = ctx.heartbeat(instance_id="host-a")
    b = ctx.heartbeat(instance_id="host-b")
    a_parts = tps(ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(a)))
    assert ctx.heartbeat(member_id=a.member_id, epoch=1, owned=a_parts).member_epoch == 2
    b_parts = tps(ctx.heartbeat(member_id=b.member_id, epoch=2))
    assert a_parts | b_parts == {("t", p) for p in range(4)}
    left = ctx.heartbeat(member_id=a.member_id, epoch=-2, instance_id="host-a")
    assert left.member_epoch == -2
    assert left.error is None
    ctx.advance(5_000)  # within the session timeout
    back = ctx.heartbeat(instance_id="host-a")  # a new process: empty member id, epoch 0
    assert back.member_id == a.member_id
    assert tps(back) == a_parts
    assert back.member_epoch > 2  # a new epoch fences the old incarnation's commits
    assert ctx.heartbeat(member_id=b.member_id, epoch=2, owned=b_parts).error is None
    ctx.check_redis_matches_state()


def test_a_crashed_static_member_restarting_takes_over_without_a_leave(ctx: GroupsContext) -> None:
    a = ctx.heartbeat(instance_id="host-a")
    back = ctx.heartbeat(instance_id="host-a")
    assert back.member_id == a.member_id
    assert tps(back) == tps(a)
    assert back.member_epoch == 2
    stale = ctx.heartbeat(member_id=a.member_id, epoch=a.member_epoch, owned=tps(a))
    # epoch 1 is the previous epoch and claims nothing new: answered (lost-response rule) ...
    assert stale.error is None
    assert ctx.redis["sluice:grp:{g}:members"] == {a.member_id: "2"}  # ... but commits need epoch 2


def test_static_leave_needs_an_instance_id(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    with pytest.raises(InvalidRequest, match="-2 is for static members"):
        ctx.heartbeat(member_id=a.member_id, epoch=-2)


def test_session_expiry_removes_a_silent_member(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    b = ctx.heartbeat()
    kept = tps(ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(a)))
    ctx.heartbeat(member_id=a.member_id, epoch=1, owned=kept)  # released: nothing pending
    for _ in range(4):
        ctx.advance(3_000)
        ctx.heartbeat(member_id=b.member_id, epoch=2)
    assert [(g, m, why) for g, m, why in ctx.removed] == [("g", a.member_id, "session_timeout")]
    b2 = ctx.heartbeat(member_id=b.member_id, epoch=ctx.groups.groups["g"].current[b.member_id].member_epoch)
    assert tps(b2) == {("t", p) for p in range(4)}
    assert isinstance(ctx.heartbeat(member_id=a.member_id, epoch=1).error, UnknownMember)
    ctx.check_redis_matches_state()


def test_a_member_that_does_not_release_in_time_is_fenced(ctx: GroupsContext) -> None:
    a = ctx.heartbeat(rebalance_timeout_ms=2_000)
    b = ctx.heartbeat()
    ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(a), rebalance_timeout_ms=2_000)
    for _ in range(3):
        ctx.advance(1_000)
        # a keeps heartbeating but keeps holding the revoked partitions.
        ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(a), rebalance_timeout_ms=2_000)
        ctx.heartbeat(member_id=b.member_id, epoch=2)
    assert ("g", a.member_id, "rebalance_timeout") in ctx.removed
    assert a.member_id not in ctx.redis["sluice:grp:{g}:members"]  # type: ignore[operator]
    b2 = ctx.heartbeat(member_id=b.member_id, epoch=ctx.groups.groups["g"].current[b.member_id].member_epoch)
    assert tps(b2) == {("t", p) for p in range(4)}


def test_epochs_are_fenced(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    future = ctx.heartbeat(member_id=a.member_id, epoch=5, owned=tps(a))
    assert isinstance(future.error, FencedMemberEpoch)
    assert "newer than" in future.error.message
    ctx.heartbeat()  # b joins: group epoch 2
    ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(a))
    a3 = ctx.heartbeat(member_id=a.member_id, epoch=1, owned={("t", 0), ("t", 1)})
    assert a3.member_epoch == 2
    # The previous epoch, claiming a partition it no longer has: fenced.
    stale = ctx.heartbeat(member_id=a.member_id, epoch=1, owned={("t", 2)})
    assert isinstance(stale.error, FencedMemberEpoch)
    assert "older than" in stale.error.message
    # The previous epoch claiming nothing new (a lost response): answered with the current state.
    lost = ctx.heartbeat(member_id=a.member_id, epoch=1, owned={("t", 0)})
    assert lost.error is None
    assert lost.member_epoch == 2


def test_bad_input(ctx: GroupsContext) -> None:
    err = ctx.heartbeat(subscription={"t": "*", "nope": "*"}).error
    assert isinstance(err, UnknownTopicOrPartition)
    assert "'nope'" in err.message
    assert isinstance(ctx.heartbeat(subscription={"t": "a b"}).error, InvalidFilter)
    err = ctx.heartbeat(assignor="fastest").error
    assert isinstance(err, UnknownAssignor)
    assert "sticky" in err.message
    assert isinstance(ctx.heartbeat(member_id="ghost", epoch=0).error, UnknownMember)
    assert isinstance(ctx.heartbeat(member_id="ghost", epoch=3).error, UnknownMember)
    with pytest.raises(InvalidArgument):
        ctx.heartbeat(group="bad group")
    with pytest.raises(InvalidArgument, match="empty"):
        ctx.heartbeat(subscription={})
    with pytest.raises(InvalidRequest):
        ctx.heartbeat(epoch=-3)
    with pytest.raises(InvalidArgument):
        ctx.heartbeat(rebalance_timeout_ms=5)
    assert "g" not in ctx.groups.groups  # nothing was created by refused joins


def test_filters_are_normalised_and_members_may_read_different_topics(ctx: GroupsContext) -> None:
    ctx.create_topic("u", 2)
    a = ctx.heartbeat(subscription={"t": "b || a"})
    b = ctx.heartbeat(subscription={"t": "a||b", "u": "*"})
    assert b.error is None
    assert tps(b) == {("u", 0), ("u", 1)}
    assert {x.filter for x in a.assignment or ()} == {"a || b"}


def test_broadcasting_members_each_get_every_partition(ctx: GroupsContext) -> None:
    a = ctx.heartbeat(model=MessageModel.BROADCASTING)
    b = ctx.heartbeat(model=MessageModel.BROADCASTING)
    assert tps(b) == tps(a) == {("t", p) for p in range(4)}
    assert "sluice:grp:{g}:owners" not in ctx.redis
    assert ctx.redis["sluice:grp:{g}:members"] == {a.member_id: "1", b.member_id: "2"}
    c = ctx.heartbeat()
    assert c.error is not None
    assert "message model" in c.error.message


def test_throttled_assignment_is_computed_by_the_timer() -> None:
    from dataclasses import replace

    from .groups_context import SETTINGS

    ctx = GroupsContext(replace(SETTINGS, assignment_interval_ms=200, assignment_batch_min_members=0))
    ctx.create_topic("t", 4)
    a = ctx.heartbeat()
    b = ctx.heartbeat()  # within 200 ms: the target waits
    g = ctx.groups.groups["g"]
    assert g.assignment_epoch == 1
    assert g.group_epoch == 2
    assert g.state() is GroupState.ASSIGNING
    assert b.member_epoch == 1
    assert tps(b) == set()
    assert b.heartbeat_interval_ms == 100
    ctx.advance(200)
    assert g.assignment_epoch == 2
    kept = tps(ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(a)))
    assert len(kept) == 2


def test_a_deleted_topic_is_taken_away_on_the_next_tick(ctx: GroupsContext) -> None:
    ctx.create_topic("u", 2)
    a = ctx.heartbeat(subscription={"t": "*", "u": "*"})
    ctx.delete_topic("u")
    ctx.advance(100)
    g = ctx.groups.groups["g"]
    assert g.group_epoch == 2
    sub = {"t": "*", "u": "*"}
    r = ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(a), subscription=sub)
    assert tps(r) == {("t", p) for p in range(4)}
    r = ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(r), subscription=sub)
    assert r.member_epoch == 2


def test_replay_reproduces_the_state(ctx: GroupsContext) -> None:
    a = ctx.heartbeat(instance_id="x")
    b = ctx.heartbeat()
    ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(a))
    ctx.heartbeat(member_id=b.member_id, epoch=2)
    ctx.heartbeat(subscription={"t": "tagA"})  # rejected: recorded nowhere durable
    assert durable(ctx.recover()) == durable(ctx.groups)


def test_list_and_describe(ctx: GroupsContext) -> None:
    a = ctx.heartbeat(subscription={"t": "tagA"})
    [summary] = ctx.groups.list_groups()
    assert (summary.group, summary.state, summary.members) == ("g", GroupState.STABLE, 1)
    d = ctx.groups.describe("g")
    [m] = d.members
    assert m.member_id == a.member_id
    assert m.subscription == {"t": "tagA"}
    assert {(x.topic, x.partition, x.track, x.filter) for x in m.assigned} == {
        ("t", p, "default", "tagA") for p in range(4)
    }
    assert d.topics == {"t": 4}
    assert d.tracks == ("default",)
