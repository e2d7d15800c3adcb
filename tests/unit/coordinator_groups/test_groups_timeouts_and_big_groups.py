"""The group's rebalance timeout bounding the member's, big groups assigned off the event loop, the
session sweep, and reading a record's timestamp from a batch for lag in seconds (pure parts)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sluice.codec.batch import BatchBuilder, stamp
from sluice.coordinator.groups.lag import record_timestamp
from sluice.coordinator.groups.model import GroupConfig, GroupState
from sluice.coordinator.groups.records import TargetAssignmentRecord

from .groups_context import SETTINGS, GroupsContext, tps


@pytest.fixture
def ctx() -> GroupsContext:
    c = GroupsContext()
    c.create_topic("t", 4)
    return c


def fenced_after(ctx: GroupsContext, member_ms: int, group_ms: int, wait_ms: int) -> bool:
    """A holds every partition; B joins; A keeps heartbeating without releasing for ``wait_ms``."""
    if group_ms:
        ctx.apply(ctx.groups.set_config("g", GroupConfig(rebalance_timeout_ms=group_ms), False, ctx.now_ms))
    a = ctx.heartbeat(rebalance_timeout_ms=member_ms)
    ctx.heartbeat()
    owned = tps(a)
    for _ in range(wait_ms // 100):
        ctx.advance(100)
        answer = ctx.heartbeat(
            member_id=a.member_id, epoch=a.member_epoch, owned=owned, rebalance_timeout_ms=member_ms
        )
        if answer.error is not None:
            return True
    return False


def test_the_group_rebalance_timeout_bounds_what_a_member_asks(ctx: GroupsContext) -> None:
    # SETTINGS' default is 5 s. The member asks 4 s, the group allows 1 s: fenced after ~1 s.
    assert fenced_after(ctx, member_ms=4_000, group_ms=1_000, wait_ms=1_500)
    assert [why for _, _, why in ctx.removed] == ["rebalance_timeout"]


def test_a_member_may_ask_for_less_than_the_group_allows() -> None:
    ctx = GroupsContext()
    ctx.create_topic("t", 4)
    assert fenced_after(ctx, member_ms=500, group_ms=3_000, wait_ms=1_000)


def test_without_a_group_setting_the_members_own_timeout_counts() -> None:
    ctx = GroupsContext()
    ctx.create_topic("t", 4)
    assert not fenced_after(ctx, member_ms=4_000, group_ms=0, wait_ms=3_000)  # > the 3 s it waited
    ctx = GroupsContext()
    ctx.create_topic("t", 4)
    assert fenced_after(ctx, member_ms=1_000, group_ms=0, wait_ms=1_500)


def test_a_member_asking_nothing_gets_the_groups_timeout() -> None:
    ctx = GroupsContext()
    ctx.create_topic("t", 4)
    assert fenced_after(ctx, member_ms=0, group_ms=700, wait_ms=1_200)


# ---- big groups: joins never run the assignor; the timer computes targets from a snapshot -------------


def big() -> GroupsContext:
    c = GroupsContext(replace(SETTINGS, assignment_batch_min_members=2, assignment_interval_ms=100))
    c.create_topic("t", 6)
    return c


def target_records(ctx: GroupsContext, before: dict[str, bytes]) -> int:
    return sum(
        1 for f, v in ctx.store.items() if f.startswith(TargetAssignmentRecord.TYPE) and before.get(f) != v
    )


def test_joins_into_a_big_group_only_move_the_group_epoch() -> None:
    ctx = big()
    a = ctx.heartbeat()
    assert len(tps(a)) == 6  # a group's first assignment is computed at once
    before = dict(ctx.store)
    joined = [ctx.heartbeat() for _ in range(3)]
    g = ctx.groups.groups["g"]
    assert g.group_epoch == 4
    assert g.assignment_epoch == 1
    assert g.state() is GroupState.ASSIGNING
    assert target_records(ctx, before) == 0  # no assignor ran
    assert all(tps(j) == set() for j in joined)
    # Newcomers hurry (they wait for partitions); the settled member keeps its regular interval.
    assert {j.heartbeat_interval_ms for j in joined} == {SETTINGS.reconcile_heartbeat_interval_ms}
    steady = ctx.heartbeat(member_id=a.member_id, epoch=a.member_epoch, owned=tps(a))
    assert steady.heartbeat_interval_ms == SETTINGS.heartbeat_interval_ms
    # The timer (service: in a worker thread) computes one target for all three joins.
    ctx.now_ms += 100
    assert ctx.apply(ctx.groups.tick(ctx.now_ms, assign_inline=False)).assigned_groups == ()
    jobs = ctx.groups.assignment_jobs(ctx.now_ms)
    assert [j.group_epoch for j in jobs] == [4]
    assert ctx.groups.assignment_jobs(ctx.now_ms) == []  # one in flight per group
    ctx.apply(ctx.groups.apply_assignment(jobs[0], jobs[0].compute(), ctx.now_ms))
    assert g.assignment_epoch == 4
    assert sorted(len(s) for s in g.targets.values()) == [1, 1, 2, 2]


def test_a_member_leaving_while_the_target_is_computed_gets_none() -> None:
    ctx = big()
    a = ctx.heartbeat()
    b = ctx.heartbeat()
    c = ctx.heartbeat()
    ctx.now_ms += 100
    [job] = ctx.groups.assignment_jobs(ctx.now_ms)
    ctx.heartbeat(member_id=c.member_id, epoch=-1)  # leaves meanwhile
    ctx.apply(ctx.groups.apply_assignment(job, job.compute(), ctx.now_ms))
    g = ctx.groups.groups["g"]
    assert c.member_id not in g.targets
    assert set(g.targets) == {a.member_id, b.member_id}
    assert g.assignment_epoch == job.group_epoch < g.group_epoch  # the leave is assigned next time
    ctx.advance(100)
    assert g.assignment_epoch == g.group_epoch
    assert sorted(len(s) for s in g.targets.values()) == [3, 3]
    ctx.check_redis_matches_state()


def test_a_result_superseded_by_an_inline_assignment_is_ignored() -> None:
    ctx = big()
    ctx.heartbeat()
    b = ctx.heartbeat()
    c = ctx.heartbeat()
    ctx.now_ms += 100
    [job] = ctx.groups.assignment_jobs(ctx.now_ms)
    ctx.advance(0)  # the timer starts no second job for the group meanwhile
    g = ctx.groups.groups["g"]
    assert g.assignment_epoch < job.group_epoch
    # Two leave: the group is small again and is assigned inline, past the job's epoch.
    ctx.heartbeat(member_id=b.member_id, epoch=-1)
    ctx.heartbeat(member_id=c.member_id, epoch=-1)
    epoch = g.assignment_epoch
    assert epoch > job.group_epoch
    assert ctx.apply(ctx.groups.apply_assignment(job, job.compute(), ctx.now_ms)).assigned_groups == ()
    assert g.assignment_epoch == epoch
    assert set(g.targets) == set(g.members)


def test_a_rejoin_into_a_big_group_gets_a_new_epoch_without_an_assignor_run() -> None:
    ctx = big()
    a = ctx.heartbeat(instance_id="i-a")
    b = ctx.heartbeat(instance_id="i-b")
    ctx.advance(100)
    g = ctx.groups.groups["g"]
    # Both converge: a releases what the new target takes away, b picks it up.
    a2 = ctx.heartbeat(member_id=a.member_id, epoch=a.member_epoch, owned=tps(a))
    a3 = ctx.heartbeat(member_id=a.member_id, epoch=a2.member_epoch, owned=tps(a2))
    ctx.heartbeat(member_id=b.member_id, epoch=b.member_epoch)
    assert g.state() is GroupState.STABLE
    before = dict(ctx.store)
    again = ctx.heartbeat(instance_id="i-a")  # a restart of the static member, same subscription
    assert again.member_id == a.member_id
    assert again.member_epoch > a3.member_epoch  # the previous incarnation is fenced
    assert tps(again) == tps(a2)  # and it keeps its partitions
    assert target_records(ctx, before) == 0  # no assignor ran


# ---- the session sweep ---------------------------------------------------------------------------------


def test_the_sweep_expires_only_silent_members_and_recovered_members_get_a_fresh_session() -> None:
    ctx = GroupsContext()
    ctx.create_topic("t", 4)
    a = ctx.heartbeat()
    b = ctx.heartbeat()
    for _ in range(12):  # b heartbeats every second, a is silent: 12 s > the 10 s session timeout
        ctx.advance(1_000)
        ctx.heartbeat(
            member_id=b.member_id, epoch=ctx.groups.groups["g"].reconciled(b.member_id).member_epoch
        )
    assert [(m, why) for _, m, why in ctx.removed] == [(a.member_id, "session_timeout")]
    # A recovered coordinator knows no session yet: everyone's starts at its first sweep.
    recovered = ctx.recover()
    assert recovered.soft.tracked("g") == 0
    later = ctx.now_ms + 60_000
    assert recovered.tick(later).response.removed == ()
    assert recovered.soft.tracked("g") == 1
    assert recovered.tick(later + 10_001).response.removed == (("g", b.member_id, "session_timeout"),)


# ---- lag in seconds: the record's timestamp from the batch columns --------------------------------------


def batch(base_offset: int, timestamps: list[int]) -> bytes:
    builder = BatchBuilder()
    for i, ts in enumerate(timestamps):
        builder.append(b"value-%d" % i, None, None, None, ts)
    data = bytearray(builder.build())
    stamp(data, 0, base_offset, 0, 0)
    return bytes(data)


def test_record_timestamp_reads_the_record_at_the_offset_from_the_columns() -> None:
    records = batch(10, [1_000, 1_005, 990]) + batch(13, [2_000, 2_001])
    assert record_timestamp(records, 10) == 1_000
    assert record_timestamp(records, 11) == 1_005
    assert record_timestamp(records, 12) == 990  # a record's own time, not the batch's max
    assert record_timestamp(records, 14) == 2_001
    assert record_timestamp(records, 5) == 1_000  # before the first batch (compacted): the next record
    assert record_timestamp(records, 15) is None  # not in what was fetched
    assert record_timestamp(records[:-3], 14) is None  # the response was cut inside the batch
    assert record_timestamp(b"", 0) is None
    assert record_timestamp(b"\x00" * 80, 0) is None  # garbage never raises
