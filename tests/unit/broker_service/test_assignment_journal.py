"""The assignment journal: crash recovery at every cut and bit flip, compaction, and an apply that costs
the partitions an update names, not the partitions the broker holds."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment, PartitionRegistry
from sluice.broker.assignment_journal import (
    JOURNAL_FILE,
    LEGACY_FILE,
    SNAPSHOT_FILE,
    AssignmentJournal,
    decode_frames,
)
from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.log.config import LogConfig
from sluice.broker.log.manager import LogManager, PartitionMeta
from sluice.broker.log.partition_log import PartitionLog

Keys = set[TopicPartitionKey]


def _changes(count: int, seed: int) -> list[tuple[Keys, Keys]]:
    """``count`` (serve, unserve) changes over a few topics, each one a plausible update."""
    rng = random.Random(seed)
    served: Keys = set()
    out = []
    for _ in range(count):
        serve = {(f"t{rng.randrange(4)}", rng.randrange(50)) for _ in range(rng.randrange(1, 6))}
        unserve = set(rng.sample(sorted(served), min(len(served), rng.randrange(3)))) - serve
        served = (served - unserve) | serve
        out.append((serve, unserve))
    return out


def _write_journal(data: Path, changes: list[tuple[Keys, Keys]]) -> tuple[list[int], list[Keys]]:
    """Append ``changes`` after an empty snapshot; returns the journal offset after each frame and the
    served set after each (index 0: before any change)."""
    journal = AssignmentJournal(data, min_compact_bytes=1 << 30)  # no compaction: one long journal
    journal.compact(set())
    ends = [journal.journal_bytes]
    states: list[Keys] = [set()]
    for serve, unserve in changes:
        journal.append(serve, unserve)
        ends.append(journal.journal_bytes)
        states.append((states[-1] - unserve) | serve)
    journal.close()
    return ends, states


def test_every_cut_of_the_journal_keeps_each_whole_change_before_it(tmp_path: Path) -> None:
    """kill -9 mid-write leaves a prefix of the journal: recovery keeps exactly the changes wholly in it."""
    ends, states = _write_journal(tmp_path, _changes(40, seed=1))
    data = (tmp_path / JOURNAL_FILE).read_bytes()
    assert len(data) == ends[-1]
    rng = random.Random(2)
    cuts = sorted({*ends, *(rng.randrange(ends[0], len(data)) for _ in range(150))})
    for cut in cuts:
        (tmp_path / JOURNAL_FILE).write_bytes(data[:cut])
        found = AssignmentJournal(tmp_path).recover()
        whole = max(i for i, end in enumerate(ends) if end <= cut)
        assert found.served == states[whole], cut
        assert found.replayed == whole
        assert found.cut_bytes == cut - ends[whole]
        assert bool(found.corruption) == (cut != ends[whole]), cut


def test_a_flipped_bit_cuts_the_journal_at_that_frame_and_is_reported(tmp_path: Path) -> None:
    ends, states = _write_journal(tmp_path, _changes(30, seed=3))
    data = (tmp_path / JOURNAL_FILE).read_bytes()
    rng = random.Random(4)
    for _ in range(100):
        pos = rng.randrange(ends[0], len(data))
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        (tmp_path / JOURNAL_FILE).write_bytes(bytes(flipped))
        found = AssignmentJournal(tmp_path).recover()
        frame = max(i for i, end in enumerate(ends) if end <= pos)  # the frame holding the bit
        assert found.served == states[frame], pos
        assert found.corruption
        assert f"at byte {ends[frame]}" in found.corruption[0]
        assert found.cut_bytes == len(data) - ends[frame]


def test_compaction_keeps_the_files_small_and_a_stale_journal_is_ignored(tmp_path: Path) -> None:
    journal = AssignmentJournal(tmp_path, min_compact_bytes=0)
    served: Keys = set()
    journal.compact(served)
    old_journal, at_compaction = b"", set(served)
    for i in range(300):
        change = {("t", i)}
        served |= change
        journal.append(change, ())
        if journal.wants_compaction():
            old_journal, at_compaction = (tmp_path / JOURNAL_FILE).read_bytes(), set(served)
            journal.compact(served)
        # The journal never grows past the snapshot (plus one frame) before being folded.
        assert journal.journal_bytes <= journal.snapshot_bytes + 64
    journal.close()
    assert journal.compactions > 3
    assert AssignmentJournal(tmp_path).recover().served == served
    # A crash between the snapshot's rename and the journal's: the older journal is ignored.
    (tmp_path / JOURNAL_FILE).write_bytes(old_journal)
    found = AssignmentJournal(tmp_path).recover()
    assert (found.served, found.corruption) == (at_compaction, [])


def test_a_corrupted_snapshot_is_reported_and_nothing_is_assumed(tmp_path: Path) -> None:
    _write_journal(tmp_path, _changes(3, seed=5))
    snapshot = bytearray((tmp_path / SNAPSHOT_FILE).read_bytes())
    snapshot[-2] ^= 0x10
    (tmp_path / SNAPSHOT_FILE).write_bytes(bytes(snapshot))
    found = AssignmentJournal(tmp_path).recover()
    assert found.served is None  # the registry then serves every local log; the coordinator corrects it
    assert "unreadable" in found.corruption[0]


def test_frames_decode_only_whole(tmp_path: Path) -> None:
    assert decode_frames(b"") == ([], 0)
    assert decode_frames(b"\x00\x00\x00\x05\x00") == ([], 0)
    assert decode_frames(b"\xff\xff\xff\xff" + b"\x00" * 20) == ([], 0)  # an absurd length


# ---- the registry over real logs ---------------------------------------------------------------


def pa(topic: str, p: int, tid: str = "X") -> PartitionAssignment:
    return PartitionAssignment(topic, tid, p)


def _noop(key: TopicPartitionKey, plog: PartitionLog) -> None:
    pass


class CountingLogs(LogManager):
    """The real log manager, counting the calls that list every partition."""

    scans = 0

    def partitions(self) -> dict[TopicPartitionKey, PartitionLog]:
        self.scans += 1
        return super().partitions()


def _registry(data: Path) -> PartitionRegistry:
    defaults = LogConfig(segment_bytes=1 << 20)
    logs = CountingLogs(data, defaults)
    logs.open_all()
    reg = PartitionRegistry(logs, defaults, data, _noop, _noop)
    reg.load()
    return reg


def test_a_restart_after_a_torn_append_serves_every_acknowledged_update(tmp_path: Path) -> None:
    reg = _registry(tmp_path)
    for i in range(5):
        reg.apply(AssignmentUpdate(0, False, (pa("t", i),), ()))
    reg.apply(AssignmentUpdate(0, True, tuple(pa("t", i) for i in range(1, 5)), ()))  # t/0 unserved
    reg.logs.close()
    reg.journal.close()
    # The process died writing a sixth frame: half of it reached the disk.
    with open(tmp_path / JOURNAL_FILE, "ab") as f:
        f.write(b"\x00\x00\x00\x40\x12\x34")
    again = _registry(tmp_path)
    assert set(again.served) == {("t", i) for i in range(1, 5)}
    assert again.recovery.cut_bytes == 6
    assert again.recovery.corruption
    again.logs.close()
    # Recovery started a clean generation: the next start finds nothing wrong.
    third = _registry(tmp_path)
    assert third.recovery.corruption == []
    assert set(third.served) == set(again.served)
    third.logs.close()


def test_the_whole_file_format_of_earlier_versions_is_read_once(tmp_path: Path) -> None:
    reg = _registry(tmp_path)
    reg.apply(AssignmentUpdate(0, False, (pa("t", 0), pa("t", 1)), ()))
    reg.logs.close()
    reg.journal.close()
    for name in (SNAPSHOT_FILE, JOURNAL_FILE):
        (tmp_path / name).unlink()
    (tmp_path / LEGACY_FILE).write_text('{"metadata_version": 3, "served": [["t", 1]]}')
    again = _registry(tmp_path)
    assert set(again.served) == {("t", 1)}
    assert not (tmp_path / LEGACY_FILE).exists()
    assert (tmp_path / SNAPSHOT_FILE).exists()
    again.logs.close()


def _with_partitions(data: Path, count: int) -> PartitionRegistry:
    """A registry serving ``count`` partitions of topic ``big`` (written as a restart would find them)."""
    for p in range(count):
        directory = data / f"big-{p}"
        directory.mkdir(parents=True)
        (directory / "partition.json").write_text(PartitionMeta("big", p, "B", None).to_json())
    reg = _registry(data)
    assert len(reg.served) == count
    return reg


@pytest.mark.parametrize("existing", [10, 500])
def test_applying_one_change_touches_only_that_partition(tmp_path: Path, existing: int) -> None:
    """The work of a one-partition update is the same with 10 or 500 partitions served: two touches
    (create its log, serve it), one journal frame, no snapshot, no listing of every partition. The
    served set is not rebuilt."""
    reg = _with_partitions(tmp_path / "data", existing)
    assert isinstance(reg.logs, CountingLogs)
    scans = reg.logs.scans
    served_before = reg.served
    touched, frames, compactions = reg.touched, reg.journal.appended, reg.journal.compactions
    reg.apply(AssignmentUpdate(0, False, (pa("new", 0),), ()))
    assert reg.touched - touched == 2
    assert reg.journal.appended - frames == 1
    assert reg.journal.compactions == compactions
    assert reg.served is served_before
    assert len(reg.served) == existing + 1
    # Removing it touches it twice again (unserve, delete); an update naming nothing here touches nothing.
    reg.apply(AssignmentUpdate(0, False, (), (pa("new", 0),)))
    assert reg.touched - touched == 4
    reg.apply(AssignmentUpdate(0, False, (), ()))
    assert reg.touched - touched == 4
    assert reg.journal.appended - frames == 2
    assert reg.logs.scans == scans
    reg.logs.close()
    shutil.rmtree(tmp_path / "data")


def test_a_failed_append_leaves_no_torn_frame_before_later_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append whose write reached the file but whose fsync failed (EIO) leaves nothing behind: a
    change the broker answered as failed is not replayed, and a torn frame cannot hide later changes."""
    journal = AssignmentJournal(tmp_path, min_compact_bytes=1 << 30)
    journal.compact(set())
    journal.append({("a", 0)}, set())
    before = (tmp_path / JOURNAL_FILE).stat().st_size

    def failing_sync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_sync)
    with pytest.raises(OSError, match="Input/output"):
        journal.append({("b", 0)}, set())
    monkeypatch.undo()
    assert (tmp_path / JOURNAL_FILE).stat().st_size == before
    journal.append({("c", 0)}, set())
    journal.close()
    found = AssignmentJournal(tmp_path).recover()
    assert found.served == {("a", 0), ("c", 0)}
    assert not found.corruption
