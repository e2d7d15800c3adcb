"""Crash recovery: torn tails are cut, indexes are rebuilt, offsets continue densely.

Each test writes a real log, leaves it as a crash would (or as a damaged disk would),
and reopens it. ``abandon`` drops the log without close(), like kill -9: nothing gets
flushed or written on the way out.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from sluice.broker.log import LogConfig, PartitionLog
from sluice.codec.batch import iter_headers

from .helpers import abandon, make_batch, read_all, segment_files, small_config

CFG = small_config(segment_bytes=1500, index_interval_bytes=200)


def filled_log(path: Path, batches: int = 30, cfg: LogConfig = CFG) -> tuple[PartitionLog, list[int]]:
    """A log of ``batches`` 3-record batches; returns it and each batch's end offset."""
    log = PartitionLog(path, cfg)
    ends = []
    for i in range(batches):
        ends.append(log.append(make_batch(3, seed=i)).last_offset + 1)
    assert len(segment_files(path)) >= 3
    return log, ends


def last_batch_start(path: Path) -> tuple[Path, int, int]:
    """(active segment file, start of its last batch, that batch's base offset)."""
    active = segment_files(path)[-1]
    data = active.read_bytes()
    pos, header = list(iter_headers(data))[-1]
    return active, pos, header.base_offset


def assert_dense_and_appendable(path: Path, expected_end: int) -> None:
    log = PartitionLog(path, CFG)
    assert log.log_end_offset == expected_end
    assert [r.offset for r in read_all(log)] == list(range(expected_end))
    result = log.append(make_batch(2, seed=999))
    assert result.base_offset == expected_end
    assert [r.offset for r in read_all(log)] == list(range(expected_end + 2))
    log.close()
    # And the repaired log reopens to the same place.
    again = PartitionLog(path, CFG)
    assert again.log_end_offset == expected_end + 2
    again.close()


def test_clean_close_and_reopen_keeps_everything(tmp_path: Path) -> None:
    log, ends = filled_log(tmp_path)
    log.close()
    reopened = PartitionLog(tmp_path, CFG)
    assert reopened.log_end_offset == ends[-1]
    assert reopened.segment_base_offsets() == [int(f.stem) for f in segment_files(tmp_path)]
    assert [r.offset for r in read_all(reopened)] == list(range(ends[-1]))


def test_crash_without_close_loses_nothing_written(tmp_path: Path) -> None:
    log, ends = filled_log(tmp_path)
    abandon(log)
    assert_dense_and_appendable(tmp_path, ends[-1])


def test_torn_write_mid_batch_is_truncated_to_the_last_whole_batch(tmp_path: Path) -> None:
    log, _ends = filled_log(tmp_path)
    abandon(log)
    active, pos, base = last_batch_start(tmp_path)
    os.truncate(active, pos + 20)  # half a header: kill -9 during the write
    assert_dense_and_appendable(tmp_path, base)
    assert active.stat().st_size == pos + len(make_batch(2, seed=999))


def test_torn_write_inside_the_body_is_truncated(tmp_path: Path) -> None:
    log, _ = filled_log(tmp_path)
    abandon(log)
    active, _pos, base = last_batch_start(tmp_path)
    os.truncate(active, active.stat().st_size - 5)
    assert_dense_and_appendable(tmp_path, base)


def test_garbage_after_the_last_batch_is_truncated(tmp_path: Path) -> None:
    log, ends = filled_log(tmp_path)
    abandon(log)
    active = segment_files(tmp_path)[-1]
    size = active.stat().st_size
    with open(active, "ab") as f:
        f.write(os.urandom(300))
    assert_dense_and_appendable(tmp_path, ends[-1])
    assert active.stat().st_size == size + len(make_batch(2, seed=999))


def test_zeroed_tail_is_truncated(tmp_path: Path) -> None:
    # What a filesystem shows after power loss with the size extended but data missing.
    log, ends = filled_log(tmp_path)
    abandon(log)
    active = segment_files(tmp_path)[-1]
    with open(active, "ab") as f:
        f.write(bytes(500))
    assert_dense_and_appendable(tmp_path, ends[-1])


def test_flipped_byte_in_the_last_batch_fails_its_crc_and_is_cut(tmp_path: Path) -> None:
    log, _ = filled_log(tmp_path)
    abandon(log)
    active, _pos, base = last_batch_start(tmp_path)
    with open(active, "r+b") as f:
        f.seek(active.stat().st_size - 3)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    assert_dense_and_appendable(tmp_path, base)


def test_recovery_scans_from_the_start_when_the_index_is_behind(tmp_path: Path) -> None:
    # The index of the active segment is written on flush/roll/close only: a crash
    # right after appends leaves it behind the log, and recovery must index the rest.
    log, ends = filled_log(tmp_path)
    log.flush()
    for i in range(5):
        log.append(make_batch(3, seed=100 + i))
    abandon(log)
    reopened = PartitionLog(tmp_path, CFG)
    assert reopened.log_end_offset == ends[-1] + 15
    for offset in range(0, reopened.log_end_offset, 4):
        res = reopened.read(offset, 10)
        assert res.base_offset_of_first <= offset < res.next_offset


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("damage", ["delete", "bad_size", "garbage", "past_end"])
def test_indexes_are_rebuilt_when_missing_or_wrong(tmp_path: Path, suffix: str, damage: str) -> None:
    log, ends = filled_log(tmp_path, batches=40)
    probe = [log.read(o, 1).base_offset_of_first for o in range(ends[-1])]
    ts_probe = [log.offset_for_timestamp(t) for t in range(995, 1010)]
    log.close()
    for path in segment_files(tmp_path, suffix):
        if damage == "delete":
            path.unlink()
        elif damage == "bad_size":
            with open(path, "ab") as f:
                f.write(b"\x01\x02\x03")
        elif damage == "garbage":
            path.write_bytes(os.urandom(max(path.stat().st_size, 24)))
        else:  # entries pointing past the end of the log
            if suffix == ".index":
                entry = struct.pack("<II", 0xFFFF, 0xFFFF)
            else:
                entry = struct.pack("<qI", 2**63 - 1, 0xFFFFFFFF)
            with open(path, "ab") as f:
                f.write(entry)
    reopened = PartitionLog(tmp_path, CFG)
    assert reopened.log_end_offset == ends[-1]
    assert [reopened.read(o, 1).base_offset_of_first for o in range(ends[-1])] == probe
    assert [reopened.offset_for_timestamp(t) for t in range(995, 1010)] == ts_probe
    reopened.close()
    # The rebuilt files are whole again: a third open finds them consistent.
    sizes = {p.name: p.stat().st_size for p in segment_files(tmp_path, suffix)}
    assert all(size % (8 if suffix == ".index" else 12) == 0 for size in sizes.values())
    third = PartitionLog(tmp_path, CFG)
    assert [r.offset for r in read_all(third)] == list(range(ends[-1]))


def test_a_torn_closed_segment_drops_everything_after_it(tmp_path: Path) -> None:
    # Power loss before the fsync of a rolled segment: its tail is gone while a later
    # segment survived. Nothing after the tear was acknowledged; keeping it would leave
    # a hole in the offsets.
    log, _ = filled_log(tmp_path)
    log.close()
    files = segment_files(tmp_path)
    first = files[0]
    data = first.read_bytes()
    pos, header = list(iter_headers(data))[-1]
    os.truncate(first, pos + 10)
    reopened = PartitionLog(tmp_path, CFG)
    assert reopened.segment_base_offsets() == [0]
    assert reopened.log_end_offset == header.base_offset
    assert [f.name for f in segment_files(tmp_path)] == [first.name]
    assert reopened.append(make_batch(1)).base_offset == header.base_offset


def test_orphan_index_files_are_removed(tmp_path: Path) -> None:
    log, _ = filled_log(tmp_path)
    log.close()
    orphan = tmp_path / f"{12345:020d}.index"
    orphan.write_bytes(b"\0" * 8)
    PartitionLog(tmp_path, CFG).close()
    assert not orphan.exists()


def test_empty_directory_is_an_empty_log_and_a_missing_one_is_created(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "new" / "p0", CFG)
    assert (log.log_start_offset, log.log_end_offset, log.size_bytes) == (0, 0, 0)
    log.close()
    assert [f.name for f in segment_files(tmp_path / "new" / "p0")] == [f"{0:020d}.log"]
