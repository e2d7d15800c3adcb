"""Disk full, through the log's write seam (``fileops``) and the free-space guard (``space``).

ENOSPC is injected into segment appends (after a short write, as a full filesystem does), into index
writes, the epoch checkpoint and producer snapshots. Each test checks the log the way an operator would:
what was acknowledged reads back, nothing else does, ``verify_partition`` finds no damage, and a reopen
sees the same log. The real disk-full test (a size-limited tmpfs, real broker processes) is
tests/integration/broker/test_disk_full.py.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.broker.log import PartitionLog, fileops
from sluice.broker.log.space import DiskSpace
from sluice.broker.log.verify import verify_partition
from sluice.cli import broker_verify
from sluice.errors import StorageFull
from tests.unit.broker_log.helpers import make_batch, read_all, small_config


class Injector:
    """Replaces ``fileops.write``/``ftruncate``: fails writes to files whose name ends in one of
    ``suffixes`` with ENOSPC, after writing ``short`` bytes of the data first (a short write)."""

    def __init__(self) -> None:
        self.suffixes: tuple[str, ...] = ()
        self.short = 0
        self.fail_truncate = False
        self.failures = 0

    @staticmethod
    def _name(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> int:
        if self.suffixes and self._name(fd).endswith(self.suffixes):
            self.failures += 1
            if self.short and len(data) > self.short:
                written = os.write(fd, bytes(memoryview(data)[: self.short]))
                self.short = 0  # the retry of the rest then hits ENOSPC, as on a full disk
                return written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, data)

    def ftruncate(self, fd: int, length: int) -> None:
        if self.fail_truncate:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.ftruncate(fd, length)


@pytest.fixture
def inject(monkeypatch: pytest.MonkeyPatch) -> Injector:
    injector = Injector()
    monkeypatch.setattr(fileops, "write", injector.write)
    monkeypatch.setattr(fileops, "ftruncate", injector.ftruncate)
    return injector


def _values(log: PartitionLog) -> list[bytes]:
    return [r.value for r in read_all(log)]


def _expected(seeds: list[int], count: int) -> list[bytes]:
    return [f"{seed}:{i}:".encode().ljust(10, b"x") for seed in seeds for i in range(count)]


def test_an_append_that_meets_enospc_after_a_short_write_is_cut_back(
    tmp_path: Path, inject: Injector
) -> None:
    log = PartitionLog(tmp_path / "p", small_config())
    acked = []
    for seed in range(5):
        log.append(make_batch(4, seed=seed))
        acked.append(seed)
    size = log.size_bytes
    inject.suffixes, inject.short = (".log",), 37
    with pytest.raises(StorageFull, match=r"append .* failed"):
        log.append(make_batch(4, seed=99))
    assert inject.failures == 2  # the short write, then ENOSPC on the rest
    # Nothing of the failed append is left: not in the file, not in memory.
    assert log.log_end_offset == 20
    assert log.size_bytes == size
    assert (tmp_path / "p" / f"{0:020d}.log").stat().st_size == size
    inject.suffixes = ()
    log.append(make_batch(4, seed=5))  # space is back: the next append lands right after
    acked.append(5)
    assert _values(log) == _expected(acked, 4)
    log.close()
    assert verify_partition(tmp_path / "p").ok
    assert _values(PartitionLog(tmp_path / "p", small_config())) == _expected(acked, 4)


def test_a_failed_cut_blocks_appends_until_a_cut_succeeds(tmp_path: Path, inject: Injector) -> None:
    log = PartitionLog(tmp_path / "p", small_config())
    log.append(make_batch(3, seed=0))
    inject.suffixes, inject.short, inject.fail_truncate = (".log",), 20, True
    with pytest.raises(StorageFull):
        log.append(make_batch(3, seed=1))
    inject.suffixes = ()  # space is back, but the stray bytes are still in the file
    with pytest.raises(Exception, match="cannot be cut off yet"):
        log.append(make_batch(3, seed=2))
    assert log.log_end_offset == 3
    inject.fail_truncate = False
    log.append(make_batch(3, seed=3))
    assert _values(log) == _expected([0, 3], 3)
    log.close()
    assert verify_partition(tmp_path / "p").ok


def test_a_stray_tail_left_by_a_crash_after_enospc_is_cut_at_open(tmp_path: Path, inject: Injector) -> None:
    """The cut itself never happened (the process died): the next open's recovery cuts the tail."""
    log = PartitionLog(tmp_path / "p", small_config())
    log.append(make_batch(3, seed=0))
    log.flush()
    inject.suffixes, inject.short, inject.fail_truncate = (".log",), 20, True
    with pytest.raises(StorageFull):
        log.append(make_batch(3, seed=1))
    inject.suffixes, inject.fail_truncate = (), False
    assert not verify_partition(tmp_path / "p").ok  # the stray bytes are there now
    for seg in log._segments:
        seg.close()
    reopened = PartitionLog(tmp_path / "p", small_config())
    assert _values(reopened) == _expected([0], 3)
    reopened.close()
    assert verify_partition(tmp_path / "p").ok


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
def test_enospc_on_an_index_write_loses_nothing_and_is_retried(
    tmp_path: Path, inject: Injector, suffix: str
) -> None:
    log = PartitionLog(tmp_path / "p", small_config(segment_bytes=1 << 20, index_interval_bytes=64))
    inject.suffixes, inject.short = (suffix,), 5  # a torn entry first, then ENOSPC
    for seed in range(10):
        log.append(make_batch(2, seed=seed))
    log.flush()  # the index write fails: logged, not raised (the data is fsynced)
    assert inject.failures >= 1
    index = tmp_path / "p" / f"{0:020d}{suffix}"
    entry = 8 if suffix == ".index" else 12
    assert index.stat().st_size % entry == 0  # the torn entry was cut back
    inject.suffixes = ()
    log.flush()  # the pending entries go out now
    log.close()
    report = verify_partition(tmp_path / "p")
    assert report.ok, (report.errors, report.index_errors)
    assert _values(PartitionLog(tmp_path / "p", small_config())) == _expected(list(range(10)), 2)


def test_enospc_on_roll_side_files_does_not_fail_the_append(tmp_path: Path, inject: Injector) -> None:
    """At a roll the sealed segment's indexes and a producer snapshot are written: both rebuildable."""
    log = PartitionLog(tmp_path / "p", small_config(segment_bytes=600))
    inject.suffixes = (".index", ".timeindex", ".snapshot", ".tmp")
    seeds = list(range(12))
    for seed in seeds:
        log.append(make_batch(3, seed=seed))
    assert len(log.segment_base_offsets()) > 2
    assert inject.failures > 0
    assert not list((tmp_path / "p").glob("*.tmp"))  # no half-written temporary file holds space
    inject.suffixes = ()
    log.close()
    assert verify_partition(tmp_path / "p").ok
    assert _values(PartitionLog(tmp_path / "p", small_config(segment_bytes=600))) == _expected(seeds, 3)


def test_enospc_on_the_epoch_checkpoint_is_retried_by_the_next_flush(
    tmp_path: Path, inject: Injector
) -> None:
    log = PartitionLog(tmp_path / "p", small_config())
    log.append(make_batch(2, seed=0), leader_epoch=1)
    log.append(make_batch(2, seed=1), leader_epoch=3)
    inject.suffixes = (".tmp",)  # the checkpoint is written to a temporary file, then renamed
    log.flush()  # does not raise: the data is durable; the checkpoint is retried
    inject.suffixes = ()
    log.flush()
    log.close()
    reopened = PartitionLog(tmp_path / "p", small_config())
    assert reopened.epoch_entries() == [(1, 0), (3, 2)]


class FakeDisk:
    """A ``statvfs`` probe with a settable free figure, counting its calls."""

    def __init__(self, free: int, total: int = 1 << 30) -> None:
        self.free, self.total, self.calls = free, total, 0

    def __call__(self, _path: Path) -> tuple[int, int]:
        self.calls += 1
        return self.free, self.total


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _guard(tmp_path: Path, disk: FakeDisk, clock: Callable[[], float], minimum: int = 1000) -> DiskSpace:
    return DiskSpace(
        tmp_path,
        minimum,
        refresh_s=5.0,
        refresh_bytes=1 << 20,
        refused_refresh_s=0.5,
        probe=disk,
        clock=clock,
    )


def test_the_guard_does_no_syscall_per_append_in_the_common_case(tmp_path: Path) -> None:
    disk, clock = FakeDisk(free=1 << 30), FakeClock()
    space = _guard(tmp_path, disk, clock)
    calls = disk.calls
    for _ in range(1000):
        space.check(100)
        space.wrote(100)
    assert disk.calls == calls  # 100 kB written, well inside refresh_bytes and refresh_s
    for _ in range(20000):
        space.check(100)
        space.wrote(100)
    assert calls < disk.calls <= calls + 3  # refreshed once per refresh_bytes (1 MiB) written
    clock.now += 6
    space.check(100)
    assert disk.calls > calls + 1


def test_the_guard_refuses_below_the_minimum_and_recovers_by_itself(tmp_path: Path) -> None:
    disk, clock = FakeDisk(free=5000), FakeClock()
    space = _guard(tmp_path, disk, clock, minimum=1000)
    log = PartitionLog(tmp_path / "p", small_config(), space=space)
    log.append(make_batch(2, seed=0))
    disk.free = 999
    clock.now += 6  # the scheduled refresh sees it
    with pytest.raises(StorageFull, match="minimum is 1000") as err:
        log.append(make_batch(2, seed=1))
    assert err.value.retriable
    assert space.full
    assert space.refusals == 1
    assert _values(log) == _expected([0], 2)  # reads go on
    calls = disk.calls
    for _ in range(100):  # refusals do not statvfs each time either
        with pytest.raises(StorageFull):
            log.append(make_batch(2, seed=1))
    assert disk.calls == calls
    disk.free = 1 << 20  # an operator freed space
    clock.now += 0.6
    log.append(make_batch(2, seed=2))  # same process, no restart
    assert _values(log) == _expected([0, 2], 2)


def test_the_guard_refuses_an_append_that_would_cross_the_minimum(tmp_path: Path) -> None:
    disk, clock = FakeDisk(free=10_000), FakeClock()
    space = _guard(tmp_path, disk, clock, minimum=1000)
    space.check(8000)
    space.wrote(8000)
    calls = disk.calls
    disk.free = 2000  # what statvfs shows after those writes
    with pytest.raises(StorageFull):
        space.check(1500)  # 10000 - 8000 - 1500 < 1000 by the estimate: statvfs confirms it
    assert disk.calls == calls + 1
    space.check(500)  # a smaller append still fits
    space.hit_no_space()  # an ENOSPC from a write also flips it to full, whatever statvfs says
    assert space.full


def test_verify_reports_damage_and_exits_non_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    log = PartitionLog(data / "t-0", small_config(index_interval_bytes=64))
    for seed in range(6):
        log.append(make_batch(3, seed=seed))
    log.close()
    assert broker_verify.main([str(data)]) == 0
    assert "1 partition(s) verified, 0 damaged" in capsys.readouterr().out
    segment = data / "t-0" / f"{0:020d}.log"
    raw = bytearray(segment.read_bytes())
    raw[-3] ^= 0xFF  # bit rot inside the last batch's records
    segment.write_bytes(bytes(raw) + b"\x00" * 7)  # and a torn tail
    index = data / "t-0" / f"{0:020d}.index"
    index.write_bytes(index.read_bytes() + (10_000).to_bytes(4, "little") + (9).to_bytes(4, "little"))
    assert broker_verify.main([str(data / "t-0")]) == 1
    out = capsys.readouterr()
    assert "DAMAGED" in out.out
    assert "corrupt batch" in out.err
    assert "7 bytes after the last whole batch" in out.err
    assert "does not name a batch" in out.err
    assert broker_verify.main([str(tmp_path / "missing")]) == 2
