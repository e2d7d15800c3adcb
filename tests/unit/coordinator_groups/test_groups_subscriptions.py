"""Per-member subscriptions: conflicts under ``reject``, offset tracks under ``split`` (seed 004)."""

from __future__ import annotations

import pytest

from sluice.coordinator.groups.model import ConflictPolicy, GroupConfig
from sluice.coordinator.groups.tracks import track_id
from sluice.errors import InconsistentSubscription, InvalidArgument, UnknownAssignor

from .groups_context import KEYS, GroupsContext, durable, tps

ALL = {("t", p) for p in range(4)}


@pytest.fixture
def ctx() -> GroupsContext:
    c = GroupsContext()
    c.create_topic("t", 4)
    return c


def split(ctx: GroupsContext) -> None:
    ctx.apply(ctx.groups.set_config("g", GroupConfig(ConflictPolicy.SPLIT), True, ctx.now_ms))


def test_reject_names_the_topic_both_expressions_and_the_other_member(ctx: GroupsContext) -> None:
    c1 = ctx.heartbeat(subscription={"t": "tagA"})
    c2 = ctx.heartbeat(subscription={"t": "tagB"})
    err = c2.error
    assert isinstance(err, InconsistentSubscription)
    for part in ("'t'", "'tagA'", "'tagB'", c1.member_id, "--conflict-policy split"):
        assert part in err.message
    assert err.fields["other_member"] == c1.member_id
    # The refused member never joined; c1 keeps everything; describe shows the refusal.
    g = ctx.groups.groups["g"]
    assert list(g.members) == [c1.member_id]
    assert any("tagB" in line for line in ctx.groups.describe("g").conflicts)
    # The same filter written differently is not a conflict.
    assert ctx.heartbeat(subscription={"t": " tagA "}).error is None


def test_a_member_changing_to_a_conflicting_filter_is_refused(ctx: GroupsContext) -> None:
    c1 = ctx.heartbeat(subscription={"t": "tagA"})
    c2 = ctx.heartbeat(subscription={"t": "tagA"})
    r = ctx.heartbeat(member_id=c2.member_id, epoch=c2.member_epoch, subscription={"t": "tagB"})
    assert isinstance(r.error, InconsistentSubscription)
    assert ctx.groups.groups["g"].members[c2.member_id].subscription == {"t": "tagA"}
    # Alone in the group, a member may change its filter: the default track follows it.
    ctx.heartbeat(member_id=c2.member_id, epoch=-1)
    r = ctx.heartbeat(member_id=c1.member_id, epoch=1, subscription={"t": "tagC"}, owned=tps(c1))
    assert r.error is None
    assert {a.filter for a in r.assignment or ()} == {"tagC"}
    assert {a.track for a in r.assignment or ()} == {"default"}


def test_split_gives_each_filter_its_own_track_with_every_partition(ctx: GroupsContext) -> None:
    # Seed 004: consumer 1 tagA, consumer 2 tagB, one group, 4 partitions; tagA's offsets are at 2.
    split(ctx)
    c1 = ctx.heartbeat(subscription={"t": "tagA"})
    default_offsets = KEYS.offsets("g", "default")
    ctx.redis[default_offsets] = {f"t/{p}": "2" for p in range(4)}
    c2 = ctx.heartbeat(subscription={"t": "tagB"})
    assert c2.error is None
    assert tps(c1) == tps(c2) == ALL  # each divides its own track: all 4 partitions each
    tagb = track_id("tagB")
    assert {a.track for a in c2.assignment or ()} == {tagb}
    assert {a.track for a in c1.assignment or ()} == {"default"}
    # The new track starts from the committed offsets of the track it diverges from.
    assert ctx.redis[KEYS.offsets("g", tagb)] == {f"t/{p}": "2" for p in range(4)}
    assert ctx.owners_in_redis(track=tagb) == {f"t/{p}": c2.member_id for p in range(4)}
    assert ctx.owners_in_redis() == {f"t/{p}": c1.member_id for p in range(4)}
    [line] = ctx.groups.describe("g").conflicts
    assert "tagA" in line
    assert "tagB" in line
    assert tagb in line
    ctx.check_redis_matches_state()
    assert durable(ctx.recover()) == durable(ctx.groups)

    # A second tagB member shares the tagB track with c2 only: c1 keeps all 4 on default.
    c3 = ctx.heartbeat(subscription={"t": "tagB"})
    c2b = ctx.heartbeat(member_id=c2.member_id, epoch=c2.member_epoch, subscription={"t": "tagB"}, owned=ALL)
    ctx.heartbeat(member_id=c2.member_id, epoch=c2.member_epoch, subscription={"t": "tagB"}, owned=tps(c2b))
    c3b = ctx.heartbeat(member_id=c3.member_id, epoch=c3.member_epoch, subscription={"t": "tagB"})
    assert tps(c2b) | tps(c3b) == ALL
    assert not tps(c2b) & tps(c3b)
    assert ctx.groups.groups["g"].targets[c1.member_id] == {("default", "t", p) for p in range(4)}

    # The tagB track outlives its members (seed 004's loss was a track deleted with its last member,
    # then restarted from default's position): its offsets stay, and a returning tagB member resumes it.
    ctx.redis[KEYS.offsets("g", tagb)] = {f"t/{p}": "7" for p in range(4)}  # the tagB members committed
    ctx.heartbeat(member_id=c3.member_id, epoch=-1)
    ctx.heartbeat(member_id=c2.member_id, epoch=-1)
    assert ctx.redis[KEYS.offsets("g", tagb)] == {f"t/{p}": "7" for p in range(4)}
    assert ctx.owners_in_redis(track=tagb) == {}
    assert ctx.redis[default_offsets] == {f"t/{p}": "2" for p in range(4)}
    assert ctx.groups.groups["g"].active_tracks() == ["default", tagb]
    assert ctx.groups.groups["g"].tracks[("t", "tagB")].idle_since_ms == ctx.now_ms
    ctx.check_redis_matches_state()
    back = ctx.heartbeat(subscription={"t": "tagB"})
    assert {a.track for a in back.assignment or ()} == {tagb}
    assert ctx.redis[KEYS.offsets("g", tagb)] == {f"t/{p}": "7" for p in range(4)}  # not copied again
    assert ctx.groups.groups["g"].tracks[("t", "tagB")].idle_since_ms == 0
    assert durable(ctx.recover()) == durable(ctx.groups)


def test_split_default_track_stays_with_its_filter(ctx: GroupsContext) -> None:
    split(ctx)
    c1 = ctx.heartbeat(subscription={"t": "tagA"})
    c2 = ctx.heartbeat(subscription={"t": "tagB"})
    ctx.heartbeat(member_id=c1.member_id, epoch=-1)  # tagA leaves, tagB still reads t
    back = ctx.heartbeat(subscription={"t": "tagA"})
    assert {a.track for a in back.assignment or ()} == {"default"}
    assert c2.error is None


def test_set_config_validates_and_merges(ctx: GroupsContext) -> None:
    cfg = ctx.apply(ctx.groups.set_config("g", GroupConfig(ConflictPolicy.SPLIT), True, ctx.now_ms))
    assert cfg.conflict_policy is ConflictPolicy.SPLIT
    cfg = ctx.apply(ctx.groups.set_config("g", GroupConfig(session_timeout_ms=5_000), False, ctx.now_ms))
    assert cfg.conflict_policy is ConflictPolicy.SPLIT
    assert cfg.session_timeout_ms == 5_000
    with pytest.raises(UnknownAssignor):
        ctx.groups.set_config("g", GroupConfig(assignor="best"), False, ctx.now_ms)
    with pytest.raises(InvalidArgument):
        ctx.groups.set_config("g", GroupConfig(heartbeat_interval_ms=9_000), False, ctx.now_ms)
    with pytest.raises(InvalidArgument):
        ConflictPolicy.parse("merge")
    # A group config set before anyone joins makes the group visible.
    assert [s.group for s in ctx.groups.list_groups()] == ["g"]
    assert durable(ctx.recover()) == durable(ctx.groups)


def test_changing_the_assignor_recomputes_the_target(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    ctx.heartbeat()
    ctx.heartbeat(member_id=a.member_id, epoch=1, owned=tps(a))
    before = ctx.groups.groups["g"].group_epoch
    ctx.apply(ctx.groups.set_config("g", GroupConfig(assignor="range"), False, ctx.now_ms))
    g = ctx.groups.groups["g"]
    assert g.group_epoch == before + 1 == g.assignment_epoch
    assert g.targets["m001"] == {("default", "t", 0), ("default", "t", 1)}
