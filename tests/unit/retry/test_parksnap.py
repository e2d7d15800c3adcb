"""Snapshots of a parking store's replay (``retry/parksnap.py``) and the DLQ mark (``ParkBook.drop_dead``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.codec.batch import Record
from sluice.retry.parkbook import H_DLQ_MARK, H_HOW, H_OP, H_PCOUNT, H_PDUE, H_PSOURCE, ParkBook
from sluice.retry.parksnap import SnapshotError, load_snapshot, snapshot_records


def _event(op: bytes, partition: int, offset: int, key: bytes, **extra: bytes) -> Record:
    headers = {H_OP: op, H_PSOURCE: f"t/{partition}/{offset}".encode(), **extra}
    return Record("t.s.PARK", 0, -1, key, f"v{offset}".encode(), "tag", headers, 1000 + offset)


def _state(book: ParkBook) -> object:
    return (
        {
            kid: (
                [(r.offset, r.key, r.value, r.tag, r.headers, r.timestamp) for r in pk.pending],
                pk.count,
                pk.due_ms,
                pk.since_ms,
            )
            for kid, pk in book.keys.items()
        },
        book.dlq_mark,
    )


events = st.lists(
    st.tuples(
        st.sampled_from([b"park", b"park", b"park", b"fail", b"resolved", b"dlqmark"]),
        st.integers(0, 2),
        st.integers(0, 40),
        st.sampled_from([b"a", b"b", b""]),
        st.integers(0, 5),
    ),
    max_size=60,
)


def _book(evs: list[tuple[bytes, int, int, bytes, int]]) -> ParkBook:
    book = ParkBook()
    for op, p, o, key, n in evs:
        extra: dict[str, bytes] = {}
        if op == b"park" and n:
            extra = {H_PCOUNT: str(n).encode(), H_PDUE: b"7", "app": b"x"}
        elif op == b"fail":
            extra = {H_PCOUNT: str(n).encode(), H_PDUE: b"9"}
        elif op == b"resolved":
            extra = {H_HOW: b"ok"}
        elif op == b"dlqmark":
            book.apply(Record("t.s.PARK", 0, -1, b"", b"", None, {H_OP: op, H_DLQ_MARK: str(o).encode()}, 0))
            continue
        book.apply(_event(op, p, o, key, **extra))
    return book


@given(events)
def test_a_snapshot_loads_to_the_state_it_was_taken_from(
    evs: list[tuple[bytes, int, int, bytes, int]],
) -> None:
    book = _book(evs)
    loaded, covers = load_snapshot(snapshot_records(book, 123, {}, 5))
    assert covers == 123
    assert _state(loaded) == _state(book)
    assert loaded.sources.keys() == book.sources.keys(), "every source kept without a low bound"
    assert loaded.max_source == book.max_source


def test_sources_below_the_low_bound_are_left_out() -> None:
    book = _book([(b"park", 0, o, b"a", 0) for o in range(10)] + [(b"resolved", 0, 9, b"a", 0)])
    loaded, _ = load_snapshot(snapshot_records(book, 1, {("t", 0): 6}, 5))
    assert sorted(loaded.sources) == [f"t/0/{o}" for o in range(6, 10)]
    assert loaded.offsets_parked(("t", 0), 6) == book.offsets_parked(("t", 0), 6)


def test_a_bad_snapshot_is_refused() -> None:
    book = _book([(b"park", 0, 1, b"a", 2), (b"park", 0, 3, b"a", 0)])
    good = snapshot_records(book, 10, {}, 5)
    with pytest.raises(SnapshotError, match="digest"):
        load_snapshot([good[0]._replace(value=b"changed"), *good[1:]])
    with pytest.raises(SnapshotError, match="counts"):
        load_snapshot(good[1:])  # a record missing
    with pytest.raises(SnapshotError, match="not a snapshot trailer"):
        load_snapshot(good[:-1])  # no trailer: the writer died mid-way
    with pytest.raises(SnapshotError):
        load_snapshot([])


def test_drop_dead_drops_each_keys_prefix_found_in_the_dlq() -> None:
    book = _book([(b"park", 0, o, b"a", 3 if o == 1 else 0) for o in (1, 3, 5)] + [(b"park", 1, 2, b"b", 1)])
    gone = book.drop_dead({"t/0/1", "t/0/3", "other/0/5"})
    assert gone == [(("t", 0), b"a", 3)]
    pk = book.keys[(("t", 0), b"a")]
    assert [r.offset for r in pk.pending] == [5]
    assert pk.count == 0, "the next one is a new head"
    assert book.drop_dead({"t/0/5", "t/1/2"}) == [(("t", 0), b"a", 5), (("t", 1), b"b", 2)]
    assert not book.keys
    assert book.seen(("t", 0), 3), "still known as parked: the cursor acknowledges it at a restart"


def test_trim_sources_forgets_the_oldest_below_their_low_bound_only() -> None:
    book = _book(
        [(b"park", 0, o, b"a", 0) for o in (1, 2, 3)] + [(b"park", 1, 1, b"b", 0), (b"park", 0, 4, b"a", 0)]
    )
    assert book.trim_sources({("t", 0): 3}) == 2
    assert list(book.sources) == ["t/0/3", "t/1/1", "t/0/4"]
    assert book.trim_sources({("t", 0): 9}) == 1, "stops at t/1/1 (no low bound: kept)"
