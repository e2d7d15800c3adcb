"""The producer table: retries written once, gaps and fenced epochs refused, bounded; damage detected."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.broker.log import producer_snapshot as snapshot
from sluice.broker.log.producer_state import (
    BATCHES_KEPT,
    NO_PRODUCER_ID,
    SEQUENCE_MODULUS,
    ProducerStateTable,
)
from sluice.errors import InvalidProducerEpoch, OutOfOrderSequence, UnknownProducerId


class _Log:
    """A partition log reduced to what the table sees: offsets handed out in append order."""

    def __init__(self, table: ProducerStateTable) -> None:
        self.table = table
        self.next_offset = 0
        self.appended: list[tuple[int, int, int]] = []  # (producer id, first sequence, count)

    def produce(self, pid: int, epoch: int, seq: int, count: int, now_ms: int = 0) -> int:
        """Append unless it is a retry; the batch's first offset either way."""
        earlier = self.table.check(pid, epoch, seq, count)
        if earlier is not None:
            return earlier.first_offset
        first = self.next_offset
        self.next_offset += count
        self.appended.append((pid, seq, count))
        self.table.record(pid, epoch, seq, count, first, first + count - 1, now_ms)
        return first


def test_a_retried_batch_is_answered_with_its_first_offsets_and_not_appended() -> None:
    log = _Log(ProducerStateTable())
    assert log.produce(7, 0, 0, 3) == 0
    assert log.produce(7, 0, 3, 2) == 3
    assert log.produce(7, 0, 0, 3) == 0  # the first answer was lost; the retry is not a second copy
    assert log.produce(7, 0, 3, 2) == 3
    assert log.appended == [(7, 0, 3), (7, 3, 2)]


def test_a_gap_is_refused_and_changes_nothing() -> None:
    log = _Log(ProducerStateTable())
    log.produce(7, 0, 0, 3)
    with pytest.raises(OutOfOrderSequence, match="expected sequence 3, got 5"):
        log.produce(7, 0, 5, 1)
    assert log.produce(7, 0, 3, 1) == 3


def test_a_retry_older_than_the_batches_kept_is_out_of_order() -> None:
    log = _Log(ProducerStateTable())
    for i in range(BATCHES_KEPT + 1):
        log.produce(7, 0, i, 1)
    with pytest.raises(OutOfOrderSequence):
        log.produce(7, 0, 0, 1)  # forgotten: neither a known retry nor the next batch
    assert log.produce(7, 0, 1, 1) == 1  # still remembered


def test_an_older_epoch_is_fenced_and_a_newer_one_starts_at_zero() -> None:
    log = _Log(ProducerStateTable())
    log.produce(7, 1, 0, 2)
    with pytest.raises(InvalidProducerEpoch, match="fenced by epoch 1"):
        log.produce(7, 0, 2, 1)
    with pytest.raises(OutOfOrderSequence, match="must start at sequence 0"):
        log.produce(7, 2, 5, 1)
    assert log.produce(7, 2, 0, 1) == 2
    with pytest.raises(InvalidProducerEpoch):
        log.produce(7, 1, 2, 1)


def test_an_unknown_producer_must_start_a_sequence() -> None:
    log = _Log(ProducerStateTable())
    with pytest.raises(UnknownProducerId, match="start again at 0"):
        log.produce(9, 0, 4, 1)
    assert log.produce(9, 0, 0, 1) == 0


def test_batches_without_a_producer_id_are_never_checked() -> None:
    log = _Log(ProducerStateTable())
    assert log.produce(NO_PRODUCER_ID, -1, -1, 2) == 0
    assert log.produce(NO_PRODUCER_ID, -1, -1, 2) == 2  # the same batch again is a second copy
    assert len(log.table) == 0


def test_sequences_wrap() -> None:
    log = _Log(ProducerStateTable())
    log.table.record(7, 0, SEQUENCE_MODULUS - 2, 2, 0, 1, 0)
    log.next_offset = 2
    assert log.produce(7, 0, 0, 1) == 2


def test_entries_expire_after_their_last_append_and_the_cap_evicts_the_least_recent() -> None:
    table = ProducerStateTable(expiration_ms=1_000, max_producers=3)
    log = _Log(table)
    log.produce(1, 0, 0, 1, now_ms=0)
    log.produce(2, 0, 0, 1, now_ms=500)
    log.produce(3, 0, 0, 1, now_ms=600)
    log.produce(1, 0, 1, 1, now_ms=700)  # producer 1 is now the most recent
    log.produce(4, 0, 0, 1, now_ms=800)  # full: evicts producer 2
    assert table.evictions == 1
    assert table.entry(2) is None
    assert table.entry(1) is not None
    assert table.expire(now_ms=1_650) == 1  # producer 3 (600) is older than 1 s; 1 (700) is not
    assert table.entry(3) is None
    assert [e.producer_id for e in table.entries()] == [1, 4]


def test_truncation_forgets_the_cut_batches_so_their_retry_is_appended_again() -> None:
    log = _Log(ProducerStateTable())
    log.produce(7, 0, 0, 2)  # offsets 0-1
    log.produce(7, 0, 2, 2)  # offsets 2-3
    log.produce(8, 0, 0, 1)  # offset 4
    log.table.truncate_to(2)
    log.next_offset = 2
    assert log.table.entry(8) is None
    assert log.produce(7, 0, 2, 2) == 2
    assert log.appended[-1] == (7, 2, 2)


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 5), st.booleans(), st.integers(0, 4)),
        min_size=1,
        max_size=60,
    )
)
def test_whatever_retries_happen_every_batch_is_written_once_in_order(
    steps: list[tuple[int, int, bool, int]],
) -> None:
    """Producers send batches, sometimes retry one of their last five: the log holds each batch once, each
    producer's batches in sequence order, and every retry is answered with the first write's offset."""
    log = _Log(ProducerStateTable())
    sent: dict[int, list[tuple[int, int, int]]] = {}  # pid -> (seq, count, first offset)
    for pid, count, retry, back in steps:
        history = sent.setdefault(pid, [])
        if retry and history:
            seq, n, first = history[-1 - min(back, len(history) - 1, BATCHES_KEPT - 1)]
            assert log.produce(pid, 0, seq, n) == first
            continue
        seq = history[-1][0] + history[-1][1] if history else 0
        history.append((seq, count, log.produce(pid, 0, seq, count)))
    for pid, history in sent.items():
        mine = [(seq, n) for p, seq, n in log.appended if p == pid]
        assert mine == [(seq, n) for seq, n, _ in history]


def _table_with_history() -> ProducerStateTable:
    log = _Log(ProducerStateTable())
    for pid in (1, 2, 3):
        for i in range(pid + 4):
            log.produce(pid, pid, i, 1, now_ms=100 * i)
    return log.table


def test_a_snapshot_restores_the_same_table(tmp_path: Path) -> None:
    table = _table_with_history()
    snapshot.write(tmp_path, 21, table.entries())
    loaded = snapshot.load_latest(tmp_path, at_most=21)
    assert loaded is not None
    offset, entries = loaded
    restored = ProducerStateTable()
    restored.restore(entries)
    assert offset == 21
    assert restored.entries() == table.entries()


@given(st.data())
def test_a_flipped_bit_anywhere_in_a_snapshot_is_detected(data: st.DataObject) -> None:
    encoded = bytearray(snapshot.encode(21, _table_with_history().entries()))
    bit = data.draw(st.integers(0, len(encoded) * 8 - 1))
    encoded[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(snapshot.CorruptSnapshot):
        snapshot.decode(bytes(encoded))


def test_a_damaged_newest_snapshot_falls_back_to_the_older_one(tmp_path: Path) -> None:
    table = _table_with_history()
    snapshot.write(tmp_path, 10, table.entries()[:1])
    newest = snapshot.write(tmp_path, 21, table.entries())
    newest.write_bytes(newest.read_bytes()[:-3])  # cut back, as a power loss can
    loaded = snapshot.load_latest(tmp_path, at_most=100)
    assert loaded is not None
    assert loaded[0] == 10
    assert not newest.exists()  # removed, so the next open does not trip on it again


def test_only_the_newest_snapshots_are_kept_and_truncation_drops_those_above(tmp_path: Path) -> None:
    for offset in (5, 10, 15):
        snapshot.write(tmp_path, offset, [])
    assert snapshot.offsets(tmp_path) == [10, 15]
    snapshot.delete_above(tmp_path, 12)
    assert snapshot.offsets(tmp_path) == [10]
    assert snapshot.load_latest(tmp_path, at_most=9) is None
