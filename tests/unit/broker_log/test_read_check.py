"""Rot found while serving (broker/log/read_check.py): a batch whose bytes changed on disk after a clean
open is never served; the read stops before it, one starting in it is a STORAGE_ERROR, the range joins
``corrupt_ranges`` (so a follower truncates to it) and the log's listener hears of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.broker.epoch_reports import DamageReports
from sluice.broker.log import PartitionLog
from sluice.broker.log.manager import LogManager
from sluice.codec.batch import iter_headers
from sluice.errors import StorageError

from .helpers import Clock, make_batch, segment_files, small_config


def _flip_middle_batch(log_file: Path) -> tuple[int, int]:
    batches = list(iter_headers(log_file.read_bytes()))
    pos, header = batches[len(batches) // 2]
    with log_file.open("r+b") as f:  # in place, as rot would: the open log reads it through the cache
        f.seek(pos + header.length - 1)
        byte = f.read(1)[0]
        f.seek(pos + header.length - 1)
        f.write(bytes([byte ^ 0x01]))
    return header.base_offset, header.next_offset


def test_a_batch_damaged_after_the_open_is_found_by_a_read_and_never_served(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, small_config(segment_bytes=1 << 20), Clock())
    for i in range(10):
        log.append(make_batch(5, value_size=50, seed=i))
    heard: list[int] = []
    log.on_damage = lambda: heard.append(1)
    bad = _flip_middle_batch(segment_files(tmp_path)[0])
    assert log.corrupt_ranges == []  # a clean open does not look
    first = log.read(0, 1 << 20)
    assert first.next_offset == bad[0]  # the read stops before the damage
    assert log.corrupt_ranges == [bad]
    assert heard
    with pytest.raises(StorageError, match="failed verification"):
        log.read(bad[0], 1 << 20)
    after = log.read(bad[1], 1 << 20)  # what follows is served
    assert after.base_offset_of_first == bad[1]
    # A follower truncates to the damage and re-fetches: the range goes with the cut.
    log.truncate_to(bad[0])
    assert log.corrupt_ranges == []


def test_damage_is_reported_once_per_interval_with_the_log_it_found(tmp_path: Path) -> None:
    logs = LogManager(tmp_path, small_config())
    plog = logs.create("t", "tid", 0)
    plog.append(make_batch(3, seed=1))
    now = [100.0]
    reports = DamageReports(logs, clock=lambda: now[0])
    woken: list[int] = []
    reports.wake = lambda: woken.append(1)
    reports.found("t", 0)
    reports.found("t", 0)  # found again by the next read: not news yet
    assert len(woken) == 1
    (report,) = reports.take()
    assert (report.topic, report.topic_id, report.partition, report.log_end_offset) == ("t", "tid", 0, 3)
    assert reports.take() == []
    now[0] += 10
    reports.found("t", 0)
    assert len(reports.take()) == 1
    logs.close()
