"""Roles and epochs on the broker (broker/roles.py through the registry over a real LogManager and
journal): followers host but do not serve, and epochs never go backwards, across restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment, PartitionRegistry, plan_update
from sluice.broker.assignment_journal import AssignmentJournal
from sluice.broker.log.config import LogConfig
from sluice.broker.log.manager import LogManager
from sluice.broker.roles import EpochMark
from sluice.errors import NotLeader, StaleControllerEpoch

from .helpers import batch, values

ME = 1


def pa(p: int, leader: int, le: int = 0, pe: int = 0, tid: str = "X") -> PartitionAssignment:
    return PartitionAssignment(
        "t", tid, p, leader=leader, leader_epoch=le, partition_epoch=pe, replicas=(0, 1, 2), isr=(0, 1, 2)
    )


def registry(data: Path) -> PartitionRegistry:
    defaults = LogConfig(segment_bytes=1 << 20)
    logs = LogManager(data, defaults)
    logs.open_all()
    reg = PartitionRegistry(logs, defaults, data, lambda k, p: None, lambda k, p: None, ME)
    reg.load()
    return reg


def test_the_plan_serves_what_this_broker_leads_and_hosts_what_it_follows() -> None:
    update = AssignmentUpdate(1, True, (pa(0, ME), pa(1, 2)))
    plan = plan_update({("t", 1)}, {}, update, ME)
    assert plan.assigned == {("t", 0)}
    assert set(plan.follow) == {("t", 1)}
    assert {c.key for c in plan.create} == {("t", 0), ("t", 1)}  # both logs exist here
    assert plan.unserve == {("t", 1)}  # led before, follows now


def test_a_follower_answers_not_leader_naming_the_leader_and_keeps_its_log(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    reg.apply(AssignmentUpdate(1, True, (pa(0, ME), pa(1, 2)), controller_epoch=3))
    reg.lookup("t", 0)
    assert reg.logs.get("t", 1) is not None
    with pytest.raises(NotLeader, match=r"led by broker 2 \(leader epoch 0\); this broker is a follower"):
        reg.lookup("t", 1)
    assert reg.not_served_error("t", 1).code_name == "NOT_LEADER"
    # Leadership moves here (epoch 1): served, with the data the log had.
    reg.logs.get("t", 1).append(batch(values(2)))  # type: ignore[union-attr]
    reg.apply(AssignmentUpdate(2, False, (pa(1, ME, le=1, pe=1),), controller_epoch=3))
    assert reg.lookup("t", 1).log_end_offset == 2
    # And away again (epoch 2): not served any more.
    reg.apply(AssignmentUpdate(3, False, (pa(1, 0, le=2, pe=2),), controller_epoch=3))
    with pytest.raises(NotLeader, match="led by broker 0"):
        reg.lookup("t", 1)


def test_a_stale_leader_epoch_is_ignored_and_the_role_kept(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    reg.apply(AssignmentUpdate(1, True, (pa(0, 2, le=5, pe=7),)))
    # An older order (epoch 4) naming this broker leader must not make it serve.
    reg.apply(AssignmentUpdate(2, False, (pa(0, ME, le=4, pe=9),)))
    with pytest.raises(NotLeader, match="led by broker 2"):
        reg.lookup("t", 0)
    # Same leader epoch, older partition epoch: also stale. A full update does not unserve it either.
    reg.apply(AssignmentUpdate(3, True, (pa(0, ME, le=5, pe=6),)))
    assert ("t", 0) in reg.following
    assert reg.epochs.marks[("t", 0)] == EpochMark("X", 5, 7, replicated=True)
    # A newer one applies.
    reg.apply(AssignmentUpdate(4, False, (pa(0, ME, le=6, pe=8),)))
    reg.lookup("t", 0)
    # A re-created topic (another topic_id) starts its epochs afresh.
    reg.apply(AssignmentUpdate(5, False, (pa(0, 2, le=0, pe=0, tid="Y"),)))
    assert reg.following[("t", 0)].topic_id == "Y"


def test_a_stale_controller_epoch_is_refused_before_anything_changes(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    reg.apply(AssignmentUpdate(1, True, (pa(0, ME),), controller_epoch=7))
    with pytest.raises(StaleControllerEpoch, match="controller epoch 6 is older than 7"):
        reg.apply(AssignmentUpdate(2, True, (pa(0, 2, le=1, pe=1),), controller_epoch=6))
    reg.lookup("t", 0)
    assert reg.metadata_version == 1
    # Epoch 0 (a sender without a term) is never refused; a newer term is recorded even when the update
    # itself is stale by metadata version.
    reg.apply(AssignmentUpdate(0, False, (), controller_epoch=0))
    assert reg.apply(AssignmentUpdate(1, False, (), controller_epoch=9)) is None
    assert reg.epochs.controller_epoch == 9


def test_epochs_survive_a_restart_and_a_compaction(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    reg.apply(AssignmentUpdate(1, True, (pa(0, ME, le=3, pe=4), pa(1, 2, le=2, pe=2)), controller_epoch=5))
    reg.close()
    again = registry(tmp_path)  # load() replays the journal, then compacts into a snapshot
    assert again.epochs.controller_epoch == 5
    assert again.epochs.marks == {
        ("t", 0): EpochMark("X", 3, 4, replicated=True),
        ("t", 1): EpochMark("X", 2, 2, replicated=True),
    }
    with pytest.raises(StaleControllerEpoch):
        again.apply(AssignmentUpdate(1, True, (pa(0, 2, le=9, pe=9),), controller_epoch=4))
    again.close()
    third = registry(tmp_path)  # now from the snapshot
    assert third.epochs.marks[("t", 0)] == EpochMark("X", 3, 4, replicated=True)
    assert third.epochs.controller_epoch == 5
    # The old order (leader epoch 2 for t/0) is still stale after two restarts: ignored, so t/0 keeps
    # what it had since the restart: not served (a replicated partition waits for a current order).
    third.apply(AssignmentUpdate(2, True, (pa(0, 2, le=2, pe=9),), controller_epoch=5))
    assert ("t", 0) not in third.following
    with pytest.raises(NotLeader, match="not served"):
        third.lookup("t", 0)
    third.apply(AssignmentUpdate(3, True, (pa(0, ME, le=3, pe=5),), controller_epoch=5))
    third.lookup("t", 0)


def test_a_journal_of_before_epochs_reads_as_no_epochs(tmp_path: Path) -> None:
    journal = AssignmentJournal(tmp_path)
    journal.compact([("t", 0)])
    journal.append([("t", 1)], [])
    journal.close()
    found = AssignmentJournal(tmp_path).recover()
    assert found.served == {("t", 0), ("t", 1)}
    assert (found.controller_epoch, found.epochs) == (0, {})


def test_a_full_update_forgets_followed_partitions_it_leaves_out(tmp_path: Path) -> None:
    reg = registry(tmp_path)
    reg.apply(AssignmentUpdate(1, True, (pa(0, 2), pa(1, 2))))
    assert set(reg.following) == {("t", 0), ("t", 1)}
    reg.apply(AssignmentUpdate(2, True, (pa(1, 2),)))
    assert set(reg.following) == {("t", 1)}
    # Not followed any more, still on disk: a plain NOT_LEADER, not one naming a leader it no longer knows.
    with pytest.raises(NotLeader, match="not served by this broker"):
        reg.lookup("t", 0)
    # A delta removing the partition forgets it too.
    reg.apply(AssignmentUpdate(3, False, (), (pa(1, 2),)))
    assert reg.following == {}


def test_after_a_restart_replicated_partitions_wait_for_the_controller_and_unreplicated_ones_serve(
    tmp_path: Path,
) -> None:
    reg = registry(tmp_path)
    single = PartitionAssignment("solo", "S", 0)  # no replica state: one replica, this broker
    reg.apply(AssignmentUpdate(1, True, (pa(0, ME), single), controller_epoch=2))
    reg.lookup("t", 0)
    assert reg.epochs.marks[("t", 0)] == EpochMark("X", 0, 0, replicated=True)
    assert ("solo", 0) not in reg.epochs.marks
    reg.close()

    again = registry(tmp_path)
    again.lookup("solo", 0)  # served at once, as before replication
    with pytest.raises(NotLeader, match="waits for the controller"):
        again.lookup("t", 0)
    # The controller's full assignment (leadership moved meanwhile): t/0 is followed, never served.
    again.apply(AssignmentUpdate(5, True, (pa(0, 2, le=1, pe=1), single), controller_epoch=3))
    with pytest.raises(NotLeader, match="led by broker 2"):
        again.lookup("t", 0)
    again.close()

    third = registry(tmp_path)
    third.apply(AssignmentUpdate(6, True, (pa(0, ME, le=2, pe=2), single), controller_epoch=3))
    third.lookup("t", 0)  # the controller says it leads again: served
    assert third.held == set()
