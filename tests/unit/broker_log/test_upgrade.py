"""A data directory written in batch format 1 is converted on open: crash-safe, idempotent, indexes
rebuilt; a format-1 batch in a produce is refused (docs/replication.md, "Batch format version 2")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.broker.log import PartitionLog
from sluice.codec.batch import decode_records, iter_headers, read_header, validate_batch
from sluice.codec.batch.v1 import is_v1
from sluice.errors import UnsupportedVersion
from tests.batch_v1 import to_v1

from .helpers import Clock, make_batch, read_all, segment_files, small_config


def _write_v1_log(
    tmp_path: Path, batches: int = 40, per_batch: int = 5
) -> tuple[Path, list[tuple[int, bytes]]]:
    """A partition directory as a format-1 broker left it, written through today's log and then
    rewritten batch by batch in format 1 (so offsets, rolls and append times are realistic)."""
    directory = tmp_path / "p"
    clock = Clock()
    log = PartitionLog(directory, small_config(), clock)
    for i in range(batches):
        log.append(make_batch(per_batch, ts=1_000 + i, seed=i))
        clock.advance(1)
    expected = [(r.offset, r.value) for r in read_all(log)]
    log.close()
    for seg in segment_files(directory):
        data = seg.read_bytes()
        seg.write_bytes(b"".join(to_v1(data[p : p + h.length]) for p, h in iter_headers(data)))
    for idx in list(directory.glob("*.index")) + list(directory.glob("*.timeindex")):
        idx.write_bytes(b"\x01" * 24)  # indexes of the old positions: must not be trusted
    return directory, expected


def test_a_format_1_directory_is_converted_on_open_with_the_same_records(tmp_path: Path) -> None:
    directory, expected = _write_v1_log(tmp_path)
    assert len(segment_files(directory)) > 2
    assert all(is_v1(seg.read_bytes()) for seg in segment_files(directory))
    log = PartitionLog(directory, small_config(), Clock())
    assert [(r.offset, r.value) for r in read_all(log)] == expected
    assert log.log_end_offset == expected[-1][0] + 1
    # Every batch on disk is format 2 now, CRC-valid, epoch 0, producer fields -1.
    for seg in segment_files(directory):
        data = seg.read_bytes()
        for pos, h in iter_headers(data):
            assert validate_batch(data, pos, 1 << 20) == h
            assert (h.partition_leader_epoch, h.producer_id, h.base_sequence) == (0, -1, -1)
    # Reads by offset work through the rebuilt indexes, from every segment.
    for offset, value in expected[::17]:
        res = log.read(offset, 1)
        assert read_header(res.data).base_offset <= offset
        assert decode_records(res.data, "t", 0, start_offset=offset)[0].value == value
    log.append(make_batch(3))
    log.close()
    reopened = PartitionLog(directory, small_config(), Clock())  # converting twice is a no-op
    assert [(r.offset, r.value) for r in read_all(reopened)][: len(expected)] == expected
    assert reopened.log_end_offset == expected[-1][0] + 4
    reopened.close()
    assert not list(directory.glob("*.v2tmp"))


def test_a_crash_mid_conversion_leaves_a_file_that_a_restart_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, expected = _write_v1_log(tmp_path)
    segments = segment_files(directory)
    real_replace = os.replace
    calls = {"n": 0}

    def crash_on_second(src: object, dst: object) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(5, "simulated crash before the rename")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", crash_on_second)
    with pytest.raises(Exception, match="converting"):
        PartitionLog(directory, small_config(), Clock())
    monkeypatch.undo()
    # Either the old or the new file, never half of one; a stale temporary copy may remain.
    assert not is_v1(segments[0].read_bytes())
    assert is_v1(segments[1].read_bytes())
    assert (directory / (segments[1].name + ".v2tmp")).exists()
    log = PartitionLog(directory, small_config(), Clock())
    assert [(r.offset, r.value) for r in read_all(log)] == expected
    log.close()
    assert not list(directory.glob("*.v2tmp"))


def test_a_torn_format_1_tail_is_not_converted(tmp_path: Path) -> None:
    directory, expected = _write_v1_log(tmp_path, batches=6)
    last = segment_files(directory)[-1]
    data = last.read_bytes()
    last.write_bytes(data[:-7])  # the last batch torn by a crash
    log = PartitionLog(directory, small_config(), Clock())
    got = [(r.offset, r.value) for r in read_all(log)]
    assert got == expected[: len(got)]
    assert len(got) == len(expected) - 5
    log.close()


def test_a_format_1_batch_in_a_produce_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path / "p", small_config(), Clock())
    log.append(make_batch(2))
    with pytest.raises(UnsupportedVersion, match="batch format 1: upgrade the client"):
        log.append(make_batch(1) + to_v1(make_batch(3)))
    assert log.log_end_offset == 2
    log.close()
