"""A TestContext for the pure group state machine: a fake clock, handlers applied as the service does.

``ctx.apply(result)`` encodes the records through the real codec into an in-memory "records hash", applies
the derived Redis key operations to an in-memory "Redis" (so tests see exactly the ownership keys the
offset store would read), and replays the records. ``ctx.advance(ms)`` moves the clock and runs the
groups' timer until it has nothing left to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from sluice.coordinator.cluster.model import Endpoint, TopicConfig
from sluice.coordinator.groups.model import (
    GroupSettings,
    HeartbeatRequest,
    HeartbeatResponse,
    MessageModel,
    TickOutcome,
)
from sluice.coordinator.groups.redis_ops import GroupKeys, RedisOp, full_sync_ops, group_ops
from sluice.coordinator.groups.state import GroupsState
from sluice.coordinator.records import RecordValue, Result
from sluice.coordinator.state import CoordinatorState
from sluice.offsetstore.keys import partition_field

T = TypeVar("T")

SETTINGS = GroupSettings(
    heartbeat_interval_ms=1_000,
    session_timeout_ms=10_000,
    rebalance_timeout_ms=5_000,
    assignment_interval_ms=0,
    reconcile_heartbeat_interval_ms=100,
)
KEYS = GroupKeys("sluice")


def apply_ops(redis: dict[str, object], ops: Iterable[RedisOp]) -> None:
    """The store's Lua script, in Python."""
    for op in ops:
        if op.op == "HSET":
            h = redis.setdefault(op.key, {})
            assert isinstance(h, dict)
            h[op.a] = op.b
        elif op.op == "HDEL":
            h = redis.get(op.key, {})
            assert isinstance(h, dict)
            h.pop(op.a, None)
        elif op.op == "SET":
            redis[op.key] = op.a
        elif op.op == "DEL":
            redis.pop(op.key, None)
        elif op.op == "HCOPY":
            src = redis.get(op.a, {})
            dst = redis.setdefault(op.key, {})
            assert isinstance(src, dict)
            assert isinstance(dst, dict)
            if op.b in src:
                dst[op.b] = src[op.b]
            else:
                dst.pop(op.b, None)
        elif op.op == "DELINDEX":
            index = redis.get(op.key, set())
            assert isinstance(index, set)
            for mid in index:
                redis.pop(op.a + mid, None)
                refs = redis.get(op.b, {}) if op.b else {}
                assert isinstance(refs, dict)
                refs.pop(op.a + mid, None)
        else:
            raise AssertionError(f"unknown op {op.op}")


class GroupsContext:
    def __init__(self, settings: GroupSettings = SETTINGS, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms
        self.settings = settings
        self.root = CoordinatorState(group_settings=settings)
        self.store: dict[str, bytes] = {}
        self.redis: dict[str, object] = {}
        self.ids = 0
        self.removed: list[tuple[str, str, str]] = []
        self.writes = 0
        #: Heartbeats quick_heartbeat answered (the fast path is exercised, not only skipped).
        self.quick_answers = 0
        self.apply(self.root.cluster.register_broker(1, Endpoint("127.0.0.1", 9001), "i1", now_ms))

    @property
    def groups(self) -> GroupsState:
        return self.root.groups

    def apply(self, result: Result[T]) -> T:
        if result.records:
            self.writes += 1
            apply_ops(self.redis, group_ops(self.groups, result.records, KEYS))
        for record in result.records:
            field, value = self.root.codec.encode(record)
            if value is None:
                self.store.pop(field, None)
            else:
                self.store[field] = value
            self.root.replay(record)
        self.check_indexes()
        return result.response

    def check_indexes(self) -> None:
        """The derived indexes the hot paths read equal what they summarise (checked after every write)."""
        for g in self.groups.groups.values():
            unsettled = {
                mid
                for mid, cur in g.current.items()
                if cur.member_epoch != g.assignment_epoch or cur.state != "stable"
            }
            assert g.unsettled == unsettled, (g.unsettled, unsettled)
            assert g.waiting == {m for m, c in g.current.items() if c.state == "unreleased_partitions"}
            if g.message_model.value == "clustering":
                assert g.target_owner == {s: m for m, slots in g.targets.items() for s in slots}

    def create_topic(self, name: str, partitions: int) -> None:
        self.apply(self.root.cluster.create_topic(name, partitions, TopicConfig(), f"id-{name}", self.now_ms))

    def delete_topic(self, name: str) -> None:
        self.apply(self.root.cluster.delete_topic(name))

    def heartbeat(
        self,
        group: str = "g",
        member_id: str = "",
        epoch: int = 0,
        subscription: Mapping[str, str] | None = None,
        owned: Iterable[tuple[str, int]] = (),
        instance_id: str = "",
        assignor: str = "",
        model: MessageModel = MessageModel.CLUSTERING,
        rebalance_timeout_ms: int = 0,
    ) -> HeartbeatResponse:
        self.ids += 1
        request = HeartbeatRequest(
            group=group,
            member_id=member_id,
            member_epoch=epoch,
            instance_id=instance_id,
            subscription=dict(subscription if subscription is not None else {"t": "*"}),
            assignor=assignor,
            message_model=model,
            owned=frozenset(owned),
            rebalance_timeout_ms=rebalance_timeout_ms,
        )
        # The service answers steady heartbeats without the write lock (quick_heartbeat): whenever it
        # answers, the full handler must agree and write nothing. Checked on every heartbeat of every test.
        quick = self.groups.quick_heartbeat(request, self.now_ms)
        result = self.groups.heartbeat(request, self.now_ms, f"m{self.ids:03d}")
        if quick is not None:
            assert not result.records, f"quick answer for a heartbeat that writes {result.records}"
            assert quick == result.response, (quick, result.response)
        self.quick_answers += quick is not None
        return self.apply(result)

    def records_of(self, request: HeartbeatRequest) -> int:
        return len(self.groups.heartbeat(request, self.now_ms, "unused").records)

    def advance(self, ms: int) -> TickOutcome:
        self.now_ms += ms
        removed: list[tuple[str, str, str]] = []
        while True:
            outcome = self.apply(self.groups.tick(self.now_ms))
            removed += outcome.removed
            if not outcome.changed:
                break
        self.removed += removed
        return TickOutcome(removed=tuple(removed))

    # ---- checks --------------------------------------------------------------------------------------

    def owners_in_redis(self, group: str = "g", track: str = "default") -> dict[str, str]:
        value = self.redis.get(KEYS.owners(group, track), {})
        assert isinstance(value, dict)
        return dict(value)

    def check_redis_matches_state(self) -> None:
        """The ownership keys equal what a full resync would write (the offset store's view == ours)."""
        expected: dict[str, object] = {}
        apply_ops(expected, full_sync_ops(self.groups, KEYS))
        for key, value in expected.items():
            if key.startswith("sluice:grp:"):
                # A missing hash is an empty one, a missing live count is 0 (as the offset store reads them).
                assert self.redis.get(key, {} if isinstance(value, dict) else "0") == value, key
        for key, value in self.redis.items():
            if key.startswith("sluice:grp:") and key not in expected:
                assert value == {}, key

    def recover(self) -> GroupsState:
        fresh = CoordinatorState(group_settings=self.settings)
        records: list[RecordValue] = [self.root.codec.decode(f, v) for f, v in self.store.items()]
        fresh.replay_all(records)
        return fresh.groups


def durable(groups: GroupsState) -> dict[str, object]:
    return {
        name: (
            g.config,
            g.group_epoch,
            g.assignment_epoch,
            dict(g.tracks),
            dict(g.members),
            dict(g.targets),
            dict(g.current),
            dict(g.owner),
        )
        for name, g in groups.groups.items()
    }


def tps(response: HeartbeatResponse) -> set[tuple[str, int]]:
    assert response.assignment is not None, response
    return {(a.topic, a.partition) for a in response.assignment}


def field(topic: str, partition: int) -> str:
    return partition_field(topic, partition)
