"""The log's descriptor budget: one per partition, a bounded LRU for sealed segments, typed
errors when the process is out of descriptors, and nothing half-created (docs/storage.md)."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sluice.broker.log import LogManager, PartitionLog
from sluice.broker.log.handles import ReadHandles
from sluice.errors import StorageError

from .helpers import make_batch, read_all, small_config


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _is_open(fd: int) -> bool:
    # The listing's own directory descriptor is listed too, and closed by now.
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@contextmanager
def soft_limit_headroom(free: int) -> Iterator[None]:
    """Lower this process's soft open-files limit to ``free`` descriptors above what is open
    now, and restore it after (the hard limit is untouched, so the soft one can go back)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    taken = {int(fd) for fd in os.listdir("/proc/self/fd") if _is_open(int(fd))}
    # The kernel hands out the lowest free number below the soft limit: count the holes.
    limit, holes = 0, 0
    while holes < free or limit in taken:
        holes += limit not in taken
        limit += 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_partition_holds_one_descriptor_however_many_segments(tmp_path: Path) -> None:
    before = open_fds()
    handles = ReadHandles(2)
    logs = [PartitionLog(tmp_path / f"p{i}", small_config(), handles=handles) for i in range(5)]
    # Newly created: 1 each (before this change: 3, the log and both indexes).
    assert open_fds() - before == 5
    for plog in logs:
        for seed in range(20):  # 4 KiB segments: several rolls each
            plog.append(make_batch(20, value_size=40, seed=seed))
        plog.flush()  # fsyncs and closes the descriptors of the sealed segments
        assert len(plog.segment_base_offsets()) > 3
    assert open_fds() - before == 5
    # Reading everything walks every sealed segment through the shared LRU of 2.
    for plog in logs:
        assert len(read_all(plog)) == 400
    assert open_fds() - before <= 5 + 2
    assert len(handles) <= 2
    assert handles.opens > 2
    assert handles.evictions == handles.opens - len(handles)
    for plog in logs:
        plog.close()
    assert open_fds() == before


def test_a_read_of_a_sealed_segment_reuses_its_descriptor(tmp_path: Path) -> None:
    handles = ReadHandles(4)
    plog = PartitionLog(tmp_path, small_config(), handles=handles)
    for seed in range(200):
        plog.append(make_batch(1, value_size=40, seed=seed))
    # Many small reads inside the first (sealed) segment: one open, then hits.
    offset = 0
    for _ in range(10):
        res = plog.read(offset, 100)
        offset = res.next_offset
    assert offset < plog.segment_base_offsets()[1]
    assert handles.opens == 1
    assert handles.hits == 9
    plog.close()
    assert len(handles) == 0


def test_restart_opens_sealed_segments_one_at_a_time(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, small_config())
    for seed in range(30):
        plog.append(make_batch(20, value_size=40, seed=seed))
    plog.close()
    before = open_fds()
    reopened = PartitionLog(tmp_path, small_config())
    assert open_fds() - before == 1
    assert len(read_all(reopened)) == 600
    reopened.close()


def test_the_lru_never_closes_a_descriptor_in_use(tmp_path: Path) -> None:
    paths = []
    for i in range(3):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"x" * 10)
        paths.append(str(path))
    handles = ReadHandles(1)
    fd0 = handles.acquire(paths[0])
    fd1 = handles.acquire(paths[1])
    # Over capacity while both are pinned: neither is closed under its reader.
    assert os.pread(fd0, 1, 0) == b"x"
    assert os.pread(fd1, 1, 0) == b"x"
    handles.forget(paths[0])  # deleted while read: closed by the last reader
    assert os.pread(fd0, 1, 0) == b"x"
    handles.release(paths[1])  # back to capacity: f1 is evicted (f0 is still pinned)
    assert handles.evictions == 1
    handles.release(paths[0])  # forgotten: closed now
    assert len(handles) == 0
    for _ in range(2):
        handles.acquire(paths[2])
        handles.release(paths[2])
    assert len(handles) == 1
    assert handles.opens == 3
    assert handles.hits == 1
    handles.close_all()
    assert len(handles) == 0


def test_out_of_descriptors_is_a_typed_error_and_leaves_no_half_created_partition(tmp_path: Path) -> None:
    # No budget to speak of: this is about the open itself failing.
    mgr = LogManager(tmp_path, small_config(), read_handles=1, descriptor_reserve=-(10**6))
    mgr.create("t", "id-1", 0)
    with soft_limit_headroom(1):
        # partition.json and the directory fsync fit in one descriptor; the segment needs two
        # at once (the log, then each index created empty): one is not enough.
        with pytest.raises(StorageError, match="EMFILE"):
            mgr.create("t", "id-1", 1)
        assert not (tmp_path / "t-1").exists()
        assert mgr.get("t", 1) is None
        # The partition already open keeps working: appends use its open descriptor.
        mgr.get("t", 0).append(make_batch(3))  # type: ignore[union-attr]
    # Descriptors free again: the same create succeeds and the partition works.
    plog = mgr.create("t", "id-1", 1)
    plog.append(make_batch(2))
    assert len(read_all(plog)) == 2
    mgr.close()


def test_a_sealed_segment_that_cannot_be_reopened_is_a_typed_error(tmp_path: Path) -> None:
    plog = PartitionLog(tmp_path, small_config(), handles=ReadHandles(1))
    for seed in range(10):
        plog.append(make_batch(20, value_size=40, seed=seed))
    with soft_limit_headroom(0), pytest.raises(StorageError, match="EMFILE"):
        plog.read(0, 1000)
    assert len(read_all(plog)) == 200  # and recovers
    plog.close()


def test_the_manager_refuses_partitions_past_its_descriptor_budget(tmp_path: Path) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    # A reserve that leaves room for exactly two partition logs.
    mgr = LogManager(tmp_path, small_config(), read_handles=8, descriptor_reserve=soft - 8 - 2)
    assert mgr.descriptor_budget() == 2
    mgr.create("t", "id-1", 0)
    mgr.create("t", "id-1", 1)
    with pytest.raises(StorageError, match="out of file descriptors") as info:
        mgr.create("t", "id-1", 2)
    assert info.value.retriable
    assert not (tmp_path / "t-2").exists()
    assert mgr.create("t", "id-1", 1) is mgr.get("t", 1)  # idempotent re-create still answers
    mgr.remove("t", 0)
    mgr.create("t", "id-1", 2)  # room again
    mgr.close()


def test_a_restart_opens_no_more_partitions_than_the_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mgr = LogManager(tmp_path, small_config())
    for p in range(3):
        mgr.create("t", "id-1", p)
    mgr.close()
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    restarted = LogManager(tmp_path, small_config(), read_handles=8, descriptor_reserve=soft - 8 - 2)
    restarted.open_all()
    # Two opened; the third stays on disk, untouched, rather than eating the connections' reserve.
    assert sorted(restarted.partitions()) == [("t", 0), ("t", 1)]
    assert (tmp_path / "t-2" / "partition.json").exists()
    assert "1 partitions on disk were not opened: the descriptor budget is 2" in caplog.text
    restarted.close()
