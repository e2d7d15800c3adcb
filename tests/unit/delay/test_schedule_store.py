"""The scheduler's pieces in process: the envelope's due time, bucket frames, the bucket files and the
near-future heap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sluice.broker.schedule.buckets import BucketStore
from sluice.broker.schedule.entry import Entry, decode_frames, encode_frame
from sluice.broker.schedule.timeline import Timeline
from sluice.client.producer.delay import SCHEDULE_HEADER, due_ms, schedule_partition
from sluice.errors import DelayTooLong, InvalidArgument

NOW = 1_800_000_000_000
WEEK = timedelta(days=7)


def entry(due: int, so: int, sp: int = 0, value: bytes = b"v") -> Entry:
    """A pending record as ``entry_of`` makes it (its coordinates header included)."""
    key = b"k" if so % 2 else None
    headers = {"h": b"1", SCHEDULE_HEADER: b"%d:%d" % (sp, so)}
    return Entry(due, sp, so, "t", 1, key, value, "tag" if so % 3 else None, headers, 5)


def test_due_ms_past_is_now_and_beyond_max_is_typed() -> None:
    assert due_ms(None, timedelta(seconds=2), NOW, WEEK) == NOW + 2000
    assert due_ms(None, timedelta(seconds=-2), NOW, WEEK) == NOW  # in the past: delivered now
    assert due_ms(datetime.fromtimestamp(1, UTC), None, NOW, WEEK) == NOW
    assert due_ms(None, WEEK, NOW, WEEK) == NOW + WEEK // timedelta(milliseconds=1)
    with pytest.raises(DelayTooLong, match="maximum delay of 604800 s"):
        due_ms(None, WEEK + timedelta(milliseconds=1), NOW, WEEK)
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        due_ms(datetime(2030, 1, 1), None, NOW, WEEK)
    with pytest.raises(InvalidArgument, match="timedelta"):
        due_ms(None, 5, NOW, WEEK)  # type: ignore[arg-type]


def test_schedule_partition_is_stable_per_target_partition() -> None:
    assert schedule_partition("t", 3, 8) == schedule_partition("t", 3, 8)
    assert len({schedule_partition("t", p, 8) for p in range(64)}) > 1


def test_frames_round_trip_and_a_torn_tail_is_cut(tmp_path: Path) -> None:
    entries = [entry(NOW + i, i) for i in range(50)]
    data = b"".join(encode_frame(e) for e in entries)
    assert decode_frames(data) == (entries, len(data))
    torn = data + encode_frame(entry(NOW, 99))[:-3]
    assert decode_frames(torn) == (entries, len(data))
    store = BucketStore(tmp_path, 1000)
    store.append(entries[:10])
    path = next(tmp_path.glob("b*.log"))
    with open(path, "ab") as f:
        f.write(b"\x05\x00\x00")  # a crash mid-write
    again = BucketStore(tmp_path, 1000)  # a new process: the first append cuts the torn tail
    again.append([entry(NOW + 1, 500)])
    loaded, _ = again.load(again.bucket_of(NOW))
    assert sorted(e.so for e in loaded) == [*range(10), 500]


def test_bucket_load_deduplicates_and_subtracts_done(tmp_path: Path) -> None:
    store = BucketStore(tmp_path, 1000)
    store.append([entry(NOW + 5, 1), entry(NOW + 5, 2), entry(NOW + 1, 3)])
    store.append([entry(NOW + 5, 1)])  # read again after a crash before the checkpoint
    store.mark_done({store.bucket_of(NOW): [(0, 2)]})
    store.sync()
    store.fsync_done(store.take_done_dirty())
    loaded, done = store.load(store.bucket_of(NOW))
    assert [(e.due, e.so) for e in loaded] == [(NOW + 1, 3), (NOW + 5, 1)]
    assert done == {(0, 2)}
    store.delete(store.bucket_of(NOW))
    assert store.ids == []
    assert list(tmp_path.iterdir()) == []


def test_timeline_keeps_only_near_buckets_in_memory(tmp_path: Path) -> None:
    store = BucketStore(tmp_path, 1000)
    far = [entry(NOW + 3_600_000 + i, i) for i in range(100)]
    near = [entry(NOW + 500, 1000 + i, sp=i % 2) for i in range(10)]
    store.append(far + near)
    tl = Timeline(store, preload_ms=2000)
    tl.advance(NOW)
    assert tl.size == 10  # the hour-ahead bucket stays on disk
    assert tl.add([entry(NOW + 100, 5000)])  # a new first-due record wakes the delivery loop
    assert tl.pop_due(NOW + 99, 100) == []
    due = tl.pop_due(NOW + 1000, 100)
    assert [(e.due, e.sp, e.so) for e in due] == sorted((e.due, e.sp, e.so) for e in due)
    assert len(due) == 11
    tl.delivered(due)
    # Past, fully delivered, but the read checkpoint does not cover it yet: kept.
    assert tl.finished(NOW + 5000, {0: 0, 1: 0}) == []
    assert tl.finished(NOW + 5000, {0: 10_000, 1: 10_000}) == [store.bucket_of(NOW)]
    store.delete(store.bucket_of(NOW))
    tl.advance(NOW + 3_600_000)
    assert tl.size == 100


def test_far_records_wait_in_coarse_buckets_and_split_when_near(tmp_path: Path) -> None:
    store = BucketStore(tmp_path, 1000)
    day = 86_400_000
    far = [entry(NOW + day + i * 60_000, i) for i in range(600)]  # ten hours of records, a day ahead
    store.append(far, now_ms=NOW)
    store.sync()
    assert store.ids == []
    assert len(store.coarse_ids) in (10, 11)  # hour-wide: a few files for days of records
    assert store.split_due(NOW) == 0
    # A day later the first coarse buckets come within the horizon and become fine ones.
    moved = store.split_due(NOW + day)
    assert 0 < moved < 600
    assert len(store.ids) == moved
    # A crash after the fine files were written and before the coarse one went: duplicates, loaded once.
    again = BucketStore(tmp_path, 1000)
    again.append(far[:5])
    loaded, _ = again.load(again.bucket_of(far[0].due))
    assert [e.so for e in loaded] == [0]
    assert again.split_due(NOW + 40 * day) == 600 - moved
    assert len(again.ids) == 600
    assert again.coarse_ids == []


def test_count_pending_counts_frames_in_fine_and_coarse_files_less_done(tmp_path: Path) -> None:
    store = BucketStore(tmp_path, 1000)
    store.append([entry(NOW + i, i) for i in range(30)], NOW)  # fine buckets
    store.append([entry(NOW + 5 * 3_600_000, 100 + i) for i in range(7)], NOW)  # a coarse bucket
    store.mark_done({store.bucket_of(NOW): [(0, 0), (0, 1)]})
    store.sync()
    assert any(tmp_path.glob("c*.log"))
    assert BucketStore(tmp_path, 1000).count_pending() == 30 + 7 - 2
    path = next(tmp_path.glob("b*.log"))
    with open(path, "ab") as f:
        f.write(encode_frame(entry(NOW, 999))[:-4])  # a torn tail is no record
    assert BucketStore(tmp_path, 1000).count_pending() == 35


def test_timeline_merges_loaded_runs_late_records_and_requeues_in_delivery_order(tmp_path: Path) -> None:
    """Each loaded bucket is a sorted run plus a heap of records that came later; popping must still
    give (due, schedule partition, schedule offset) order across both and across buckets, stop at the
    first record not due, respect the batch limit, and put a failed batch back in order."""
    store = BucketStore(tmp_path, 1000)
    # Two buckets; many records due at the same ms, from two schedule partitions, written out of order.
    first = [entry(NOW + 500 + i % 3, 100 - i, sp=i % 2) for i in range(40)]
    second = [entry(NOW + 1000 + i % 5, 200 + i) for i in range(20)]
    store.append(first + second)
    tl = Timeline(store, preload_ms=2000)
    tl.advance(NOW)
    assert tl.size == 60
    # Records read after their bucket was loaded, due among the loaded ones, and one read again.
    late = [entry(NOW + 501, 1, sp=1), entry(NOW + 500, 2), entry(NOW + 1002, 300), first[5]]
    assert tl.add(late)  # (NOW + 500, 0, 2) is now the first due
    assert tl.size == 63
    everything = sorted([*first, *second, *late[:3]])
    assert tl.next_due() == NOW + 500
    assert tl.pop_due(NOW + 499, 100) == []
    batch = tl.pop_due(NOW + 2000, 25)
    assert batch == everything[:25]
    tl.requeue(batch[10:])  # their send failed and recovery did not find them: back, in order
    assert tl.pop_due(NOW + 1000, 1000) == [e for e in everything[10:] if e.due <= NOW + 1000]
    rest = tl.pop_due(NOW + 2000, 1000)
    assert rest == [e for e in everything if e.due > NOW + 1000]
    assert tl.size == 0
    assert tl.next_due() is None


def test_a_load_that_pauses_sorts_in_chunks_and_merges_to_the_same_order(tmp_path: Path) -> None:
    """The scheduler's loads pause between chunks (one list.sort would hold the GIL throughout): the
    merged chunks must give exactly the order of one sort, same-due records by their offsets."""
    store = BucketStore(tmp_path, 10_000)
    records = [entry(NOW + (i * 7919) % 1000, i, sp=i % 3) for i in range(9_001)]
    store.append(records)
    pauses: list[int] = []
    loaded, _ = store.load(store.bucket_of(NOW), lambda: pauses.append(1))
    assert loaded == sorted(records)
    assert len(pauses) >= 9_001 // 2_000  # it did pause between the chunks
