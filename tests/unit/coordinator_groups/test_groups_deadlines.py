"""The group timer looks only at groups with something due (issue 20): retention deadlines in a heap,
sessions and assignments over the live groups only; 600 empty groups are never walked between their
deadlines, and expire in a few writes."""

from __future__ import annotations

from dataclasses import replace

from sluice.coordinator.groups.deadlines import Deadlines
from sluice.coordinator.groups.model import ConflictPolicy, GroupConfig
from sluice.coordinator.groups.timer import EXPIRE_BATCH

from .groups_context import KEYS, SETTINGS, GroupsContext

RETENTION = 60_000


def test_deadlines_pop_what_is_due_earliest_first_and_drop_stale_entries() -> None:
    d = Deadlines()
    assert d.set("a", 30)
    assert d.set("b", 10)
    assert not d.set("c", 20)  # not earlier than b
    d.set("b", 40)  # moved: the entry at 10 is stale
    d.set("c", None)  # nothing due any more
    assert d.next_at() == 30
    assert d.pop_due(35, 10) == ["a"]
    assert d.pop_due(100, 10) == ["b"]
    assert d.next_at() is None
    assert len(d) == 0


def test_churn_does_not_grow_the_heap_without_bound() -> None:
    d = Deadlines()
    for i in range(20_000):
        d.set("g", i)
    assert len(d._heap) <= 2 * len(d) + 1024
    assert d.pop_due(10**9, 5) == ["g"]


def test_empty_groups_are_not_live_and_expire_whole_in_batches() -> None:
    ctx = GroupsContext(replace(SETTINGS, offsets_retention_ms=RETENTION))
    ctx.create_topic("t", 1)
    live = ctx.heartbeat(group="live", subscription={"t": "*"})
    names = [f"e{i:04d}" for i in range(600)]
    for name in names:
        m = ctx.heartbeat(group=name, subscription={"t": "*"})
        ctx.redis[KEYS.offsets(name, "default")] = {"t/0": "1"}
        ctx.heartbeat(group=name, member_id=m.member_id, epoch=-1)
    g = ctx.groups
    assert list(g.live) == ["live"]  # the timer's passes look at this one group only
    assert len(g.deadlines) == len(names)
    assert g.deadlines.next_at() == g.groups[names[0]].earliest_idle_ms + RETENTION
    ctx.heartbeat(group="live", member_id=live.member_id, epoch=-1)
    assert not g.live
    writes = ctx.writes
    ctx.advance(RETENTION - 1)
    assert ctx.writes == writes  # nothing due: nothing written
    ctx.advance(1)
    assert g.groups == {}
    assert ctx.writes - writes == -(-(len(names) + 1) // EXPIRE_BATCH)  # whole groups, EXPIRE_BATCH a write
    assert [k for k in ctx.redis if "{e" in k and ctx.redis[k] not in ({}, set())] == []
    assert len(g.deadlines) == 0
    ctx.check_redis_matches_state()


def test_a_live_group_s_idle_binding_and_empty_groups_due_together_all_expire() -> None:
    ctx = GroupsContext(replace(SETTINGS, offsets_retention_ms=5_000))  # shorter than the sessions
    ctx.create_topic("t", 1)
    ctx.apply(ctx.groups.set_config("mixed", GroupConfig(ConflictPolicy.SPLIT), True, ctx.now_ms))
    ctx.heartbeat(group="mixed", subscription={"t": "tagA"})
    b = ctx.heartbeat(group="mixed", subscription={"t": "tagB"})
    ctx.heartbeat(group="mixed", member_id=b.member_id, epoch=-1)
    for name in ("e1", "e2", "e3"):
        m = ctx.heartbeat(group=name, subscription={"t": "*"})
        ctx.heartbeat(group=name, member_id=m.member_id, epoch=-1)
    outcome_writes = ctx.writes
    ctx.advance(5_000)
    assert sorted(ctx.groups.groups) == ["mixed"]
    assert [key[1] for key in ctx.groups.groups["mixed"].tracks] == ["tagA"]
    assert ctx.writes - outcome_writes == 2  # the three empty groups in one write, the binding in another
    assert list(ctx.groups.live) == ["mixed"]
    ctx.check_redis_matches_state()
