"""What the heartbeat stream relies on in the pure state machine: the lock-free answer to steady heartbeats
(``quick_heartbeat``) and the members a write must tell to heartbeat now (``members_to_nudge``).

Every heartbeat of every test through ``GroupsContext`` also checks that a quick answer equals the full
handler's and writes nothing; these tests make sure the quick path is taken when it should be and
declined when the heartbeat changes something.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

import pytest

from sluice.coordinator.groups.model import HeartbeatRequest
from sluice.coordinator.groups.state import NudgeBasis
from sluice.coordinator.records import Result

from .groups_context import SETTINGS, GroupsContext, tps

T = TypeVar("T")


@pytest.fixture
def ctx() -> GroupsContext:
    c = GroupsContext()
    c.create_topic("t", 4)
    return c


def request(member_id: str, epoch: int, owned: set[tuple[str, int]], **kw: Any) -> HeartbeatRequest:
    fields: dict[str, Any] = {"subscription": {"t": "*"}, "owned": frozenset(owned), **kw}
    return HeartbeatRequest("g", member_id, epoch, **fields)


def test_a_steady_heartbeat_is_answered_by_the_quick_path(ctx: GroupsContext) -> None:
    r = ctx.heartbeat()
    owned = tps(r)
    before = ctx.quick_answers
    again = ctx.heartbeat(member_id=r.member_id, epoch=r.member_epoch, owned=owned)
    assert ctx.quick_answers == before + 1
    assert again.assignment is None
    assert again.member_epoch == r.member_epoch
    # Claiming less than it holds: still nothing to write (it is STABLE), but the answer repeats the
    # assignment so the member takes its partitions back.
    partial = ctx.groups.quick_heartbeat(request(r.member_id, r.member_epoch, {("t", 0)}), ctx.now_ms)
    assert partial is not None
    assert {(a.topic, a.partition) for a in partial.assignment or ()} == owned


def test_the_quick_path_refreshes_the_session(ctx: GroupsContext) -> None:
    r = ctx.heartbeat()
    soft = ctx.groups.soft.members[("g", r.member_id)]
    ctx.now_ms += 5_000
    assert ctx.groups.quick_heartbeat(request(r.member_id, r.member_epoch, tps(r)), ctx.now_ms) is not None
    assert soft.last_seen_ms == ctx.now_ms


@pytest.mark.parametrize(
    "change",
    ["join", "leave", "other_epoch", "new_subscription", "new_timeout", "unknown_member", "negative"],
)
def test_the_quick_path_declines_what_may_change_something(ctx: GroupsContext, change: str) -> None:
    ctx.create_topic("u", 2)
    r = ctx.heartbeat()
    owned = tps(r)
    req = {
        "join": request(r.member_id, 0, owned),
        "leave": request(r.member_id, -1, set()),
        "other_epoch": request(r.member_id, r.member_epoch + 1, owned),
        "new_subscription": request(r.member_id, r.member_epoch, owned, subscription={"t": "*", "u": "*"}),
        "new_timeout": request(r.member_id, r.member_epoch, owned, session_timeout_ms=20_000),
        "unknown_member": request("nobody", r.member_epoch, owned),
        "negative": request(r.member_id, r.member_epoch, owned | {("t", -1)}),
    }[change]
    assert ctx.groups.quick_heartbeat(req, ctx.now_ms) is None


def test_a_member_with_partitions_to_release_is_not_answered_quickly_once_it_releases(
    ctx: GroupsContext,
) -> None:
    a = ctx.heartbeat()
    ctx.heartbeat()  # b joins: a must release half
    a2 = ctx.heartbeat(member_id=a.member_id, epoch=a.member_epoch, owned=tps(a))
    kept = tps(a2)
    assert kept < tps(a)
    # Still holding everything: nothing changes (its revocation is pending), so the quick path may answer.
    assert ctx.groups.quick_heartbeat(request(a.member_id, a2.member_epoch, tps(a)), ctx.now_ms) is not None
    # Releasing frees partitions: that is a write.
    assert ctx.groups.quick_heartbeat(request(a.member_id, a2.member_epoch, kept), ctx.now_ms) is None


def nudged(ctx: GroupsContext, result: Result[T]) -> list[tuple[str, str]]:
    """Apply ``result`` as the service does and return whom its write tells to heartbeat now."""
    touched = ctx.groups.touched_groups(result.records)
    basis: NudgeBasis = ctx.groups.nudge_basis(result.records, touched)
    ctx.apply(result)
    return ctx.groups.members_to_nudge(result.records, basis)


def test_a_join_tells_the_members_whose_target_changed(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    join = ctx.groups.heartbeat(request("", 0, set()), ctx.now_ms, "m900")
    who = nudged(ctx, join)
    assert ("g", a.member_id) in who
    assert ("g", "m900") in who  # its own target too; the service skips the requester itself


def test_a_release_tells_the_member_waiting_for_the_partition(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    b = ctx.heartbeat()
    b2 = ctx.heartbeat(member_id=b.member_id, epoch=b.member_epoch)  # at the target epoch, waiting
    assert ctx.groups.groups["g"].waiting == {b.member_id}
    a2 = ctx.heartbeat(member_id=a.member_id, epoch=a.member_epoch, owned=tps(a))
    release = ctx.groups.heartbeat(request(a.member_id, a2.member_epoch, tps(a2)), ctx.now_ms, "unused")
    assert nudged(ctx, release) == [("g", b.member_id)]
    b3 = ctx.heartbeat(member_id=b.member_id, epoch=b2.member_epoch)  # b held nothing yet
    assert len(tps(b3)) == 2


def test_a_steady_write_elsewhere_tells_nobody(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    ctx.create_topic("u", 2)
    change = ctx.groups.heartbeat(
        request(a.member_id, a.member_epoch, tps(a), session_timeout_ms=20_000), ctx.now_ms, "unused"
    )
    assert change.records  # the member record changed
    assert nudged(ctx, change) == []


def test_a_removed_member_is_told(ctx: GroupsContext) -> None:
    a = ctx.heartbeat()
    b = ctx.heartbeat()
    ctx.heartbeat(member_id=a.member_id, epoch=a.member_epoch, owned=tps(a))
    ctx.now_ms += 11_000  # past b's session (10 s); a heartbeats on
    ctx.heartbeat(member_id=a.member_id, epoch=a.member_epoch, owned=tps(a))
    tick = ctx.groups.tick(ctx.now_ms)
    who = nudged(ctx, tick)
    assert ("g", b.member_id) in who


def test_a_big_group_pushes_targets_only_once_they_caught_up_with_the_membership() -> None:
    ctx = GroupsContext(replace(SETTINGS, assignment_batch_min_members=2, assignment_interval_ms=100))
    ctx.create_topic("t", 6)
    a = ctx.heartbeat()
    b = ctx.heartbeat()
    ctx.now_ms += 100
    job = ctx.groups.assignment_jobs(ctx.now_ms)[0]
    ctx.apply(ctx.groups.apply_assignment(job, job.compute(), ctx.now_ms))  # caught up: a and b
    c_join = ctx.groups.heartbeat(request("", 0, set()), ctx.now_ms, "m900")
    assert nudged(ctx, c_join) == []  # the target is behind the membership: nobody is pushed yet
    ctx.now_ms += 100
    job = ctx.groups.assignment_jobs(ctx.now_ms)[0]
    applied = ctx.groups.apply_assignment(job, job.compute(), ctx.now_ms)
    who = nudged(ctx, applied)
    assert ("g", "m900") in who
    assert {("g", a.member_id), ("g", b.member_id)} & set(who)  # someone gives partitions to m900
