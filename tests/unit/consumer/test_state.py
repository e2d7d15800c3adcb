"""Subscription state: positions, what is committable, in-flight tracking, and chunk cutting."""

from __future__ import annotations

import pytest

from sluice.client.consumer.membership import TargetPartition
from sluice.client.consumer.prefetch import RECORD_OVERHEAD, cut_chunks
from sluice.client.consumer.state import (
    Assignment,
    InFlight,
    PartitionLifecycle,
    PartitionState,
    SubscriptionState,
)
from sluice.codec.batch import Record

TP = ("orders", 0)


def lifecycle(part: PartitionState) -> PartitionLifecycle:
    """The lifecycle read anew: mypy keeps an asserted ``part.lifecycle`` across the calls that change it."""
    return part.lifecycle


def started(in_flight_min: bool, position: int = 10, committed: int = 10) -> SubscriptionState:
    s = SubscriptionState(in_flight_min)
    part = s.add(TargetPartition("orders", 0, "default", "*"))
    assert part.lifecycle is PartitionLifecycle.AWAITING_POSITION
    assert s.to_commit() == {}  # nothing to commit before the position is known
    s.start(part, position, committed)
    return s


def test_in_flight_min_is_the_smallest_unfinished_offset() -> None:
    f = InFlight()
    f.add([7, 8, 9])
    assert f.min() == 7
    assert len(f) == 3
    f.done(8)  # finished out of order: 7 still holds the commit back
    assert f.min() == 7
    assert len(f) == 2
    f.done(7)
    assert f.min() == 9
    f.done(7)  # twice, or never handed out: no effect
    f.done(42)
    assert f.min() == 9
    assert len(f) == 1
    f.done(9)
    assert f.min() is None
    assert len(f) == 0


def test_poll_mode_commits_what_the_previous_poll_returned() -> None:
    s = started(in_flight_min=False)
    part = s.parts[TP]
    s.returned_done()
    s.handed_out(part, (), 15)  # poll 1 returned 10..14
    assert s.to_commit() == {}  # still being processed
    s.returned_done()  # poll 2: 10..14 are done
    assert s.to_commit() == {TP: (15, "default")}
    s.committed_ok(TP, 15)
    assert s.to_commit() == {}


def test_in_flight_min_mode_never_commits_past_an_unfinished_record() -> None:
    s = started(in_flight_min=True)
    part = s.parts[TP]
    s.handed_out(part, [10, 11, 12, 13], 14)
    for off in (13, 11, 12):
        s.done(TP, off)
    assert s.to_commit() == {}  # 10 is still in flight: committing 14 could lose it
    s.done(TP, 10)
    assert s.to_commit() == {TP: (14, "default")}


def test_an_empty_filtered_fetch_advances_the_commit_only_when_nothing_is_in_flight() -> None:
    s = started(in_flight_min=True)
    part = s.parts[TP]
    s.handed_out(part, [10], 11)
    s.skipped_to(part, 50, nothing_in_flight=False)  # the filter skipped 11..49
    assert part.position == 50
    assert s.to_commit() == {}  # 10 is in flight
    s.done(TP, 10)
    assert s.to_commit() == {TP: (50, "default")}

    p = started(in_flight_min=False)
    ppart = p.parts[TP]
    p.returned_done()
    p.skipped_to(ppart, 30, nothing_in_flight=True)  # RocketMQ's correctTagsOffset
    assert p.to_commit() == {TP: (30, "default")}


def test_seek_pause_and_revoke_bump_the_fetch_epoch() -> None:
    s = started(in_flight_min=False)
    part = s.parts[TP]
    epochs = [part.fetch_epoch]
    s.seek(part, 3)
    epochs.append(part.fetch_epoch)
    s.pause(part)
    epochs.append(part.fetch_epoch)
    s.resume(part)
    epochs.append(part.fetch_epoch)
    s.begin_revoke(part)
    epochs.append(part.fetch_epoch)
    assert epochs == sorted(set(epochs))
    assert part.position == 3
    with pytest.raises(AssertionError):
        s.resume(part)  # REVOKING is final


def test_assignments_are_replaced_and_the_old_one_goes_stale() -> None:
    s = SubscriptionState(False)
    first = s.assignment
    second = Assignment(3, {TP: TargetPartition("orders", 0, "default", "*")})
    s.replace_assignment(second)
    assert first.stale.is_set()
    assert not second.stale.is_set()
    assert s.assignment is second


def rec(p: int, off: int, topic: str = "orders", size: int = 10) -> Record:
    return Record(topic, p, off, None, b"x" * size, None, {}, 0)


def test_cut_chunks_with_filter_skips_and_moves_without_records() -> None:
    runs = [(("orders", 0), [rec(0, 5), rec(0, 6)]), (("orders", 1), [rec(1, 0), rec(1, 3)])]
    before = {("orders", 0): 5, ("orders", 1): 0, ("orders", 2): 7, ("orders", 3): 9}
    after = {("orders", 0): 10, ("orders", 1): 4, ("orders", 2): 12, ("orders", 3): 9}
    epochs = {("orders", 0): 1, ("orders", 1): 2, ("orders", 2): 3, ("orders", 3): 4}
    chunks = cut_chunks(runs, before, after, epochs)
    got = [(c.tp, c.fetch_epoch, [r.offset for r in c.records], c.next_offset) for c in chunks]
    assert got == [
        (("orders", 0), 1, [5, 6], 10),  # 7..9 were filtered out: the position moves past them
        (("orders", 1), 2, [0, 3], 4),
        (("orders", 2), 3, [], 12),  # nothing matched at all, yet the position moved
    ]
    assert chunks[0].nbytes == 2 * (10 + RECORD_OVERHEAD)


def test_cut_chunks_two_runs_of_one_partition_and_removed_partitions() -> None:
    runs = [
        (("a", 0), [rec(0, 1, "a")]),
        (("b", 0), [rec(0, 2, "b")]),
        (("a", 0), [rec(0, 2, "a")]),
        (("gone", 0), [rec(0, 0, "gone")]),
    ]
    epochs = {("a", 0): 1, ("b", 0): 1}
    after = {("a", 0): 5, ("b", 0): 3}
    chunks = cut_chunks(runs, {("a", 0): 1, ("b", 0): 2}, after, epochs)
    assert [(c.tp, c.records[0].offset, c.next_offset) for c in chunks] == [
        (("a", 0), 1, 2),
        (("b", 0), 2, 3),
        (("a", 0), 2, 5),  # only the partition's last run carries the fetch position
    ]


def test_restart_forgets_a_recreated_topics_position_until_it_is_looked_up_again() -> None:
    s = started(in_flight_min=True, position=10, committed=3)
    part = s.parts[TP]
    s.handed_out(part, [10, 11], 12)
    epoch = part.fetch_epoch
    s.restart(part)
    assert part.lifecycle is PartitionLifecycle.AWAITING_POSITION
    assert (part.position, part.committable, part.committed) == (-1, -1, -1)
    assert len(part.in_flight) == 0
    assert part.fetch_epoch == epoch + 1  # buffered records of the old topic are dropped
    assert s.to_commit() == {}  # the old position is never committed
    s.start(part, 0, -1)  # looked up again on the new topic: its first record
    assert s.to_commit() == {TP: (0, "default")}
    paused = started(in_flight_min=False)
    p = paused.parts[TP]
    paused.pause(p)
    paused.restart(p)
    assert p.lifecycle is PartitionLifecycle.PAUSED  # stays paused; resume looks the position up
    paused.resume(p)
    assert lifecycle(p) is PartitionLifecycle.AWAITING_POSITION
