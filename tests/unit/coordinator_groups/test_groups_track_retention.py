"""Offset tracks kept by filter, not by membership: retention, returning members, handovers.

Seed 004's loss came back in another shape: a split track was deleted with its last member, so a tagB
member that restarted was handed the default (tagA) track's position and skipped every tagB record
produced while it was away. Here a binding (topic, filter) -> track and its offsets outlive the
members until ``offsets_retention_ms``; a filter without a binding is *handed over* a position, which
is recorded (source track and filter, time) with the offsets it started from.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from sluice.coordinator.groups.model import ConflictPolicy, GroupConfig, HeartbeatResponse
from sluice.coordinator.groups.records import GroupMetadataRecord, TrackEntry
from sluice.coordinator.groups.tracks import track_id

from .groups_context import KEYS, SETTINGS, GroupsContext, durable, tps

RETENTION = 60_000
TAG_B = track_id("tagB")
TAG_C = track_id("tagC")


@pytest.fixture
def ctx() -> GroupsContext:
    c = GroupsContext(replace(SETTINGS, offsets_retention_ms=RETENTION))
    c.create_topic("t", 2)
    return c


def split(ctx: GroupsContext) -> None:
    ctx.apply(ctx.groups.set_config("g", GroupConfig(ConflictPolicy.SPLIT), True, ctx.now_ms))


def steady(ctx: GroupsContext, member: HeartbeatResponse, topic_filter: str) -> HeartbeatResponse:
    """Heartbeats until the member holds its target; the last answer (epoch, assignment) is kept."""
    answer = member
    owned = tps(member)
    for _ in range(5):
        nxt = ctx.heartbeat(
            member_id=member.member_id,
            epoch=answer.member_epoch,
            subscription={"t": topic_filter},
            owned=owned,
        )
        if nxt.assignment is not None:
            owned = {(a.topic, a.partition) for a in nxt.assignment}
        answer = replace(nxt, assignment=tuple(sorted(nxt.assignment or ())) or answer.assignment)
    return answer


def live_for(ctx: GroupsContext, member: HeartbeatResponse, topic_filter: str, ms: int) -> None:
    """Advance the clock by ``ms`` while ``member`` keeps heartbeating (its session is 10 s)."""
    step = 5_000
    for _ in range(ms // step):
        ctx.advance(step)
        steady(ctx, member, topic_filter)


def offsets(ctx: GroupsContext, track: str) -> object:
    return ctx.redis.get(KEYS.offsets("g", track))


def handover(ctx: GroupsContext, track: str) -> object:
    return ctx.redis.get(KEYS._keys.handover("g", track))


def test_an_idle_split_track_expires_after_the_retention_and_a_newcomer_is_handed_over_again(
    ctx: GroupsContext,
) -> None:
    split(ctx)
    a = steady(ctx, ctx.heartbeat(subscription={"t": "tagA"}), "tagA")
    b = ctx.heartbeat(subscription={"t": "tagB"})
    ctx.redis[KEYS.offsets("g", "default")] = {"t/0": "9", "t/1": "9"}
    ctx.redis[KEYS.offsets("g", TAG_B)] = {"t/0": "4", "t/1": "5"}
    ctx.heartbeat(member_id=b.member_id, epoch=-1)
    left_at = ctx.now_ms

    live_for(ctx, a, "tagA", RETENTION - 5_000)
    assert offsets(ctx, TAG_B) == {"t/0": "4", "t/1": "5"}  # within the retention: kept
    assert ("t", "tagB") in ctx.groups.groups["g"].tracks
    live_for(ctx, a, "tagA", 5_000)
    assert ctx.now_ms - left_at >= RETENTION
    assert ("t", "tagB") not in ctx.groups.groups["g"].tracks
    for key in (KEYS.offsets("g", TAG_B), KEYS.owners("g", TAG_B), KEYS._keys.handover("g", TAG_B)):
        assert key not in ctx.redis, key
    assert offsets(ctx, "default") == {"t/0": "9", "t/1": "9"}  # read all along: untouched
    ctx.check_redis_matches_state()
    assert durable(ctx.recover()) == durable(ctx.groups)

    # After expiry a tagB member starts over: a new handover from the default track, recorded.
    again = ctx.heartbeat(subscription={"t": "tagB"})
    assert {x.track for x in again.assignment or ()} == {TAG_B}
    entry = ctx.groups.groups["g"].tracks[("t", "tagB")]
    assert (entry.source, entry.inherited_filter, entry.since_ms) == ("default", "tagA", ctx.now_ms)
    assert offsets(ctx, TAG_B) == handover(ctx, TAG_B) == {"t/0": "9", "t/1": "9"}


def test_an_empty_group_s_offsets_expire_too_and_a_zero_retention_keeps_them() -> None:
    for retention, kept in ((RETENTION, False), (0, True)):
        ctx = GroupsContext(replace(SETTINGS, offsets_retention_ms=retention))
        ctx.create_topic("t", 2)
        a = ctx.heartbeat(subscription={"t": "tagA"})
        ctx.redis[KEYS.offsets("g", "default")] = {"t/0": "3", "t/1": "3"}
        ctx.heartbeat(member_id=a.member_id, epoch=-1)
        outcome = ctx.advance(RETENTION)
        # An empty group whose every binding expired goes whole (as Kafka's), with every key it had.
        assert ("g" in ctx.groups.groups) is kept
        assert (("t", "tagA") in ctx.groups.groups["g"].tracks) if kept else True
        assert (offsets(ctx, "default") == {"t/0": "3", "t/1": "3"}) is kept
        assert outcome.removed == ()
        if not kept:
            assert offsets(ctx, "default") in (None, {})
            assert [k for k in ctx.redis if "{g}" in k] == []
            assert [f for f in ctx.store if f.partition(":")[2].partition("/")[0] == "g"] == []
            assert len(ctx.groups.deadlines) == 0
            assert not ctx.groups.live


def test_a_filter_change_under_split_starts_from_the_member_s_previous_filter(ctx: GroupsContext) -> None:
    split(ctx)
    ctx.heartbeat(subscription={"t": "tagA"})
    b = steady(ctx, ctx.heartbeat(subscription={"t": "tagB"}), "tagB")
    ctx.redis[KEYS.offsets("g", "default")] = {"t/0": "9", "t/1": "9"}
    ctx.redis[KEYS.offsets("g", TAG_B)] = {"t/0": "4", "t/1": "5"}
    changed = ctx.heartbeat(
        member_id=b.member_id, epoch=b.member_epoch, subscription={"t": "tagC"}, owned=tps(b)
    )
    assert changed.error is None
    entry = ctx.groups.groups["g"].tracks[("t", "tagC")]
    # Its own previous position (tagB's), not the default's: nothing it had not read is jumped over.
    assert (entry.track, entry.source, entry.inherited_filter) == (TAG_C, TAG_B, "tagB")
    assert offsets(ctx, TAG_C) == handover(ctx, TAG_C) == {"t/0": "4", "t/1": "5"}
    # tagB's binding stays (idle), so changing back resumes it where it was.
    assert ctx.groups.groups["g"].tracks[("t", "tagB")].idle_since_ms == ctx.now_ms
    ctx.check_redis_matches_state()
    assert durable(ctx.recover()) == durable(ctx.groups)
    [line] = [x for x in ctx.groups.describe("g").conflicts if "tagC" in x]
    assert "handed the position of filter 'tagB'" in line


def test_reject_hands_the_topic_s_one_position_to_the_next_filter_and_records_it(ctx: GroupsContext) -> None:
    a = steady(ctx, ctx.heartbeat(subscription={"t": "tagA"}), "tagA")
    ctx.redis[KEYS.offsets("g", "default")] = {"t/0": "5", "t/1": "6"}
    changed = ctx.heartbeat(
        member_id=a.member_id, epoch=a.member_epoch, subscription={"t": "tagC"}, owned=tps(a)
    )
    assert changed.error is None
    tracks = ctx.groups.groups["g"].tracks
    assert ("t", "tagA") not in tracks
    entry = tracks[("t", "tagC")]
    assert (entry.track, entry.source, entry.inherited_filter) == ("default", "default", "tagA")
    # Same track, same position; the position it started from is kept for `sluice track`.
    assert offsets(ctx, "default") == handover(ctx, "default") == {"t/0": "5", "t/1": "6"}
    assert any("took over track default from filter 'tagA'" in x for x in ctx.groups.describe("g").conflicts)
    # The member leaves: the binding stays (idle) and says which filter advanced the position.
    ctx.heartbeat(member_id=a.member_id, epoch=-1)
    assert ctx.groups.groups["g"].tracks[("t", "tagC")].idle_since_ms == ctx.now_ms
    ctx.check_redis_matches_state()
    assert durable(ctx.recover()) == durable(ctx.groups)


def test_track_entries_written_before_handovers_still_decode() -> None:
    old = {
        "group": "g",
        "group_epoch": 3,
        "assignment_epoch": 3,
        "created_ms": 1,
        "tracks": [["t", "a", "default", ""]],
    }
    record = GroupMetadataRecord.from_dict(1, old)
    assert record.tracks == (TrackEntry("t", "a", "default"),)
    assert GroupMetadataRecord.from_dict(1, record.to_dict()) == record
