"""The acked-range set and the cursor: correctness against a reference set, and memory."""

from __future__ import annotations

import random
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.ranges import AckRanges, runs
from sluice.v1 import offset_store_pb2


def as_set(r: AckRanges) -> set[int]:
    b = r.flat
    return {o for i in range(0, len(b), 2) for o in range(b[i], b[i + 1])}


def test_runs_groups_consecutive_offsets() -> None:
    assert list(runs([1, 2, 3, 7, 9, 10])) == [(1, 4), (7, 8), (9, 11)]
    assert list(runs([])) == []


def test_add_merges_overlapping_and_adjacent_ranges() -> None:
    r = AckRanges()
    r.add(10, 12)
    r.add(14, 16)
    r.add(12, 14)  # bridges both
    assert list(r.flat) == [10, 16]
    r.add(20, 21)
    r.add(5, 30)  # swallows everything
    assert list(r.flat) == [5, 30]
    assert 5 in r
    assert 29 in r
    assert 30 not in r
    assert 4 not in r


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 20)), max_size=60))
def test_add_matches_a_reference_set(ops: list[tuple[int, int]]) -> None:
    r = AckRanges()
    ref: set[int] = set()
    for start, length in ops:
        r.add(start, start + length)
        ref.update(range(start, start + length))
        b = r.flat
        assert all(b[i] < b[i + 1] for i in range(len(b) - 1)), "sorted, disjoint and non-adjacent"
    assert as_set(r) == ref
    for probe in range(0, 230):
        assert (probe in r) == (probe in ref)


def test_cursor_mark_delete_absorbs_ranges() -> None:
    c = PartitionCursor(0)
    c.ack_sorted([1, 2, 5])
    assert c.mark_delete == 0
    assert list(c.acked.flat) == [1, 3, 5, 6]
    c.ack_sorted([0])
    assert c.mark_delete == 3
    assert list(c.acked.flat) == [5, 6]
    c.ack_sorted([3, 4])
    assert c.mark_delete == 6
    assert not c.acked
    assert c.is_acked(5)
    assert not c.is_acked(6)


def test_cursor_tracks_redeliveries_and_dirtiness() -> None:
    c = PartitionCursor(0)
    assert not c.dirty
    assert c.bump_redelivery(3) == 1
    assert c.bump_redelivery(3) == 2
    assert c.dirty
    snap = c.snapshot()
    c.mark_saved(snap.version)
    assert not c.dirty
    c.ack_sorted([3])
    assert c.redelivery_count(3) == 0
    assert c.dirty


def test_loaded_cursor_is_normalised() -> None:
    c = PartitionCursor(0, mark_delete=10, acked_ranges=[10, 15, 20, 22])
    assert c.mark_delete == 15
    assert list(c.acked.flat) == [20, 22]


def test_random_acks_end_fully_acknowledged() -> None:
    rng = random.Random(7)
    offsets = list(range(5000))
    rng.shuffle(offsets)
    c = PartitionCursor(0)
    for i in range(0, 5000, 37):
        c.ack_sorted(sorted(offsets[i : i + 37]))
    assert c.mark_delete == 5000
    assert not c.acked


def test_alternate_ack_of_a_million_stays_under_20_mb() -> None:
    """Issue 4: every other message of 1,000,000 acknowledged; the cursor must stay < 20 MB."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        c = PartitionCursor(0)
        for start in range(0, 1_000_000, 2000):
            c.ack_sorted(range(start + 1, start + 2000, 2))  # odd offsets: 1000 per call, as batched acks
        used = tracemalloc.get_traced_memory()[0] - base
        snap = c.snapshot()
        wire = offset_store_pb2.Cursor(mark_delete=snap.mark_delete, acked_ranges=snap.acked_ranges)
        with_snapshot = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(c.acked) == 500_000
    assert c.mark_delete == 0
    assert c.acked.count() == 500_000
    # The SaveCursors message's own buffer (upb, 8 bytes a bound, ~8 MB more while a flush builds it)
    # is allocated outside tracemalloc's view; the Python side must not add to it.
    print(f"\nalternate-ack cursor: {used / 1e6:.1f} MB; during a flush {with_snapshot / 1e6:.1f} MB")
    assert used < 20_000_000
    assert with_snapshot < 20_000_000
    assert len(wire.acked_ranges) == 1_000_000
