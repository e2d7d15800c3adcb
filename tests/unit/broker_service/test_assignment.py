"""Partition assignment: the pure plan and the registry over a real LogManager."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.broker.assignment import (
    AssignmentUpdate,
    PartitionAssignment,
    PartitionRegistry,
    TopicOverrides,
    plan_update,
)
from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.log.config import LogConfig
from sluice.broker.log.manager import LogManager
from sluice.broker.log.partition_log import PartitionLog
from sluice.errors import InvalidArgument, InvalidPartitions, InvalidTopic, NotLeader, UnknownTopicOrPartition

from .helpers import batch, values


def pa(topic: str, p: int, tid: str = "X", **cfg: int) -> PartitionAssignment:
    return PartitionAssignment(topic, tid, p, TopicOverrides(**cfg))


def test_plan_worked_example() -> None:
    served = {("a", 0), ("a", 1)}
    on_disk = {("a", 0): "X", ("a", 1): "X", ("b", 0): "Y"}
    update = AssignmentUpdate(1, True, (pa("a", 0), pa("c", 0, "Z")), (pa("b", 0, "Y"),))
    plan = plan_update(served, on_disk, update)
    assert plan.delete == [("b", 0)]
    assert [c.key for c in plan.create] == [("c", 0)]
    assert plan.serve == {("a", 0), ("c", 0)}  # a/1 no longer served, but not deleted


def test_plan_incremental_adds_to_what_is_served() -> None:
    plan = plan_update({("a", 0)}, {("a", 0): "X"}, AssignmentUpdate(2, False, (pa("a", 1),), ()))
    assert plan.serve == {("a", 0), ("a", 1)}
    assert [c.key for c in plan.create] == [("a", 1)]


def test_plan_replaces_a_dead_topic_incarnation_and_ignores_stale_removals() -> None:
    on_disk = {("a", 0): "OLD"}
    plan = plan_update(set(), on_disk, AssignmentUpdate(1, False, (pa("a", 0, "NEW"),), ()))
    assert [r.key for r in plan.replace] == [("a", 0)]
    assert plan.create == []
    plan = plan_update({("a", 0)}, {("a", 0): "NEW"}, AssignmentUpdate(2, False, (), (pa("a", 0, "OLD"),)))
    assert plan.delete == []
    assert plan.serve == {("a", 0)}


class Hooks:
    def __init__(self) -> None:
        self.events: list[tuple[str, TopicPartitionKey]] = []

    def serve(self, key: TopicPartitionKey, plog: PartitionLog) -> None:
        self.events.append(("serve", key))

    def unserve(self, key: TopicPartitionKey, plog: PartitionLog) -> None:
        self.events.append(("unserve", key))


def registry(data: Path) -> tuple[PartitionRegistry, Hooks]:
    defaults = LogConfig(segment_bytes=1 << 20)
    logs = LogManager(data, defaults)
    logs.open_all()
    hooks = Hooks()
    reg = PartitionRegistry(logs, defaults, data, hooks.serve, hooks.unserve)
    reg.load()
    return reg, hooks


def test_lookup_errors_distinguish_unknown_from_not_served(tmp_path: Path) -> None:
    reg, hooks = registry(tmp_path)
    reg.apply(AssignmentUpdate(1, True, (pa("t", 0), pa("t", 1)), ()))
    assert reg.lookup("t", 0) is reg.logs.get("t", 0)
    assert hooks.events == [("serve", ("t", 0)), ("serve", ("t", 1))]
    with pytest.raises(NotLeader):
        reg.lookup("t", 5)  # a partition of a topic this broker knows
    with pytest.raises(UnknownTopicOrPartition):
        reg.lookup("nope", 0)
    with pytest.raises(UnknownTopicOrPartition):
        reg.lookup("t", -1)
    with pytest.raises(InvalidTopic):
        reg.lookup("bad name!", 0)


def test_full_assignment_unserves_but_keeps_data_and_remove_deletes(tmp_path: Path) -> None:
    reg, hooks = registry(tmp_path)
    reg.apply(AssignmentUpdate(1, True, (pa("t", 0), pa("t", 1)), ()))
    reg.lookup("t", 1).append(batch(values(3)))
    reg.apply(AssignmentUpdate(2, True, (pa("t", 0),), ()))
    with pytest.raises(NotLeader):
        reg.lookup("t", 1)
    kept = reg.logs.get("t", 1)
    assert kept is not None
    assert kept.log_end_offset == 3
    # Assigned back: served again, with its data.
    reg.apply(AssignmentUpdate(3, False, (pa("t", 1),), ()))
    assert reg.lookup("t", 1).log_end_offset == 3
    reg.apply(AssignmentUpdate(4, False, (), (pa("t", 1),)))
    assert reg.logs.get("t", 1) is None
    assert not (tmp_path / "t-1").exists()
    assert ("unserve", ("t", 1)) in hooks.events


def test_versioning_contract_with_the_coordinator(tmp_path: Path) -> None:
    reg, _ = registry(tmp_path)
    # Nothing applied yet: a delta is refused (it assumes a base we do not have), a full one is not.
    assert reg.apply(AssignmentUpdate(3, False, (pa("t", 9),), ())) is None
    assert reg.apply(AssignmentUpdate(5, True, (pa("t", 0),), ())) is not None
    assert reg.apply(AssignmentUpdate(4, True, (), ())) is None  # an older full update
    assert reg.apply(AssignmentUpdate(5, False, (pa("t", 2),), ())) is None  # a delta not newer
    assert (
        reg.apply(AssignmentUpdate(5, True, (pa("t", 0),), ())) is not None
    )  # an equal full one is harmless
    assert set(reg.served) == {("t", 0)}
    assert reg.apply(AssignmentUpdate(6, False, (pa("t", 1),), ())) is not None
    assert reg.apply(AssignmentUpdate(0, False, (pa("t", 2),), ())) is not None  # version 0: operator
    assert set(reg.served) == {("t", 0), ("t", 1), ("t", 2)}
    assert reg.metadata_version == 6


def test_topic_overrides_reach_the_log(tmp_path: Path) -> None:
    reg, _ = registry(tmp_path)
    reg.apply(AssignmentUpdate(0, False, (pa("t", 0, segment_bytes=4096, retention_ms=60_000),), ()))
    cfg = reg.lookup("t", 0).config
    assert cfg.segment_bytes == 4096
    assert cfg.retention_ms == 60_000
    assert cfg.index_interval_bytes == LogConfig().index_interval_bytes  # the rest are defaults


def test_invalid_updates_change_nothing(tmp_path: Path) -> None:
    reg, _ = registry(tmp_path)
    with pytest.raises(InvalidTopic):
        reg.apply(AssignmentUpdate(1, False, (pa("ok", 0), pa("not ok", 0)), ()))
    with pytest.raises(InvalidPartitions):
        reg.apply(AssignmentUpdate(1, False, (pa("ok", -1),), ()))
    with pytest.raises(InvalidArgument):
        reg.apply(AssignmentUpdate(1, False, (pa("ok", 0, tid=""),), ()))
    with pytest.raises(InvalidArgument):
        reg.apply(AssignmentUpdate(1, False, (pa("ok", 0, segment_bytes=-5),), ()))
    assert reg.served == {}
    assert reg.logs.get("ok", 0) is None


def test_a_restart_serves_what_was_served(tmp_path: Path) -> None:
    reg, _ = registry(tmp_path)
    reg.apply(AssignmentUpdate(1, True, (pa("t", 0), pa("t", 1)), ()))
    reg.apply(AssignmentUpdate(2, True, (pa("t", 0),), ()))
    reg.logs.close()
    again, _ = registry(tmp_path)
    assert set(again.served) == {("t", 0)}
    assert again.logs.get("t", 1) is not None  # kept on disk, not served
    assert again.metadata_version == 0  # a fresh process asks the coordinator for everything
    again.logs.close()
