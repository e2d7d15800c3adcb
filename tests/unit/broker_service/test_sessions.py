"""Incremental fetch sessions (KIP-227): forms, epochs, eviction, and what a response carries."""

from __future__ import annotations

import itertools

import pytest

from sluice.broker.fetch import PartitionRead, PartitionSpec
from sluice.broker.sessions import FetchSessionCache
from sluice.errors import FetchSessionNotFound, InvalidFetchSessionEpoch


def spec(topic: str, p: int = 0, offset: int = 0) -> PartitionSpec:
    return PartitionSpec(topic, p, offset, 1 << 20, "")


def answer(s: PartitionSpec, hwm: int, records: bytes = b"", position: int | None = None) -> PartitionRead:
    part = PartitionRead(spec=s, log=None, position=s.fetch_offset if position is None else position)
    part.high_watermark = hwm
    part.log_start_offset = 0
    if records:
        part.batches.append(records)
    return part


def cache(**kw: int) -> FetchSessionCache:
    ids = itertools.count(100)
    return FetchSessionCache(new_id=lambda: next(ids), **kw)


def test_sessionless_fetch_opens_nothing() -> None:
    c = cache()
    ctx = c.context(0, -1, [spec("a")], [], now_ms=0)
    assert ctx.session_id == 0
    assert ctx.session is None
    assert len(c) == 0
    parts = [answer(spec("a"), 5)]
    assert ctx.select(parts) == parts


def test_full_then_incremental_sends_only_changes() -> None:
    c = cache()
    a, b = spec("a"), spec("b")
    ctx = c.context(0, 0, [a, b], [], now_ms=0)
    assert ctx.session_id == 100
    assert not ctx.incremental
    # The full response carries everything.
    assert len(ctx.select([answer(a, 10), answer(b, 0)])) == 2
    # Incremental, nothing new anywhere: nothing to send.
    ctx = c.context(100, 1, [], [], now_ms=1)
    assert ctx.incremental
    assert [s.key for s in ctx.specs] == [("a", 0), ("b", 0)]
    assert ctx.select([answer(a, 10), answer(b, 0)]) == []
    # b's high watermark moved: only b is sent.
    ctx = c.context(100, 2, [], [], now_ms=2)
    sent = ctx.select([answer(a, 10), answer(b, 3)])
    assert [p.key for p in sent] == [("b", 0)]


def test_records_errors_and_filtered_progress_are_sent() -> None:
    c = cache()
    a, b, d = spec("a"), spec("b"), spec("d")
    c.context(0, 0, [a, b, d], [], 0).select([answer(a, 5), answer(b, 5), answer(d, 5)])
    ctx = c.context(100, 1, [], [], 1)
    with_records = answer(a, 5, records=b"x")
    moved = answer(b, 5, position=4)  # a filter skipped records: the consumer must learn next_offset
    failed = answer(d, 5)
    failed.error = InvalidFetchSessionEpoch("boom")  # any per-partition error
    assert ctx.select([with_records, moved, failed]) == [with_records, moved, failed]


def test_changed_and_forgotten_partitions_update_the_session() -> None:
    c = cache()
    c.context(0, 0, [spec("a"), spec("b")], [], 0)
    ctx = c.context(100, 1, [spec("a", offset=7), spec("c")], [("b", 0)], 1)
    assert [(s.topic, s.fetch_offset) for s in ctx.specs] == [("a", 7), ("c", 0)]


def test_partitions_with_data_move_to_the_back() -> None:
    c = cache()
    a, b = spec("a"), spec("b")
    c.context(0, 0, [a, b], [], 0).select([answer(a, 5, records=b"x"), answer(b, 5)])
    ctx = c.context(100, 1, [], [], 1)
    assert [s.topic for s in ctx.specs] == ["b", "a"]


def test_epoch_must_follow_and_unknown_sessions_are_reported() -> None:
    c = cache()
    c.context(0, 0, [spec("a")], [], 0)
    with pytest.raises(InvalidFetchSessionEpoch, match="expected epoch 1"):
        c.context(100, 2, [], [], 1)
    c.context(100, 1, [], [], 1)
    with pytest.raises(InvalidFetchSessionEpoch):
        c.context(100, 1, [], [], 1)  # a replay
    with pytest.raises(FetchSessionNotFound):
        c.context(999, 1, [], [], 1)
    with pytest.raises(FetchSessionNotFound):
        c.context(0, 3, [], [], 1)


def test_epoch_zero_with_an_id_replaces_and_minus_one_closes() -> None:
    c = cache()
    c.context(0, 0, [spec("a")], [], 0)
    ctx = c.context(100, 0, [spec("b")], [], 1)
    assert ctx.session_id == 101
    assert 100 not in c
    assert 101 in c
    ctx = c.context(101, -1, [spec("b")], [], 2)
    assert ctx.session_id == 0
    assert len(c) == 0


def test_idle_sessions_expire() -> None:
    c = cache(idle_timeout_ms=1000)
    c.context(0, 0, [spec("a")], [], 0)
    c.context(100, 1, [], [], 900)
    with pytest.raises(FetchSessionNotFound):
        c.context(100, 2, [], [], 2000)


def test_a_full_cache_evicts_the_idle_or_smaller_session_or_declines() -> None:
    c = cache(max_sessions=2, min_evict_ms=1000)
    c.context(0, 0, [spec("a"), spec("b")], [], 0)  # 100: two partitions
    c.context(0, 0, [spec("c")], [], 0)  # 101: one partition
    # Nobody idle long enough, and nobody smaller than a one-partition newcomer: no session.
    assert c.context(0, 0, [spec("d")], [], 10).session_id == 0
    # A three-partition newcomer may evict the smallest session.
    ctx = c.context(0, 0, [spec("x"), spec("y"), spec("z")], [], 20)
    assert ctx.session_id == 102
    assert 101 not in c
    assert 100 in c
    # Once the least recently used session is idle long enough, it goes.
    ctx = c.context(0, 0, [spec("w")], [], 5000)
    assert ctx.session_id == 103
    assert 100 not in c
    assert c.evictions == 2


def test_an_incremental_request_reads_only_the_dirty_partitions_in_fetch_order() -> None:
    c = cache()
    a, b, d = spec("a"), spec("b"), spec("d")
    ctx = c.context(0, 0, [a, b, d], [], now_ms=0)
    assert ctx.added == [a.key, b.key, d.key]
    parts = [answer(a, 0), answer(b, 0), answer(d, 0)]
    ctx.select(parts)
    ctx.settle(parts)  # every partition caught up and told: nothing left to read
    idle = c.context(ctx.session_id, 1, [], [], now_ms=1)
    assert (idle.specs, idle.others) == ([], 3)
    assert idle.session is not None
    idle.session.dirty.add(d.key)  # an append, as the session's standing watch marks it
    changed = c.context(ctx.session_id, 2, [spec("a", offset=0)], [b.key], now_ms=2)
    assert [s.key for s in changed.specs] == [a.key, d.key]
    assert (changed.others, changed.forgotten) == (0, [b.key])
    # A partition that returned records stays dirty until the client sends its new offset.
    with_records = answer(d, 5, b"xx", position=5)
    changed.select([with_records])
    changed.settle([with_records, answer(a, 0)])
    assert c.context(ctx.session_id, 3, [], [], now_ms=3).specs == [d]
