"""ParkBook: the replay of a pull group's PARK.<group> event log (docs/poison-keys.md, "Pull consumers")."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.codec.batch import Record
from sluice.retry.parkbook import H_HOW, H_OP, H_PCOUNT, H_PDUE, H_PSOURCE, ParkBook, parse_source

TP = ("orders", 3)


def _event(offset: int, op: bytes, src: str, key: bytes = b"k", value: bytes = b"", **extra: bytes) -> Record:
    headers = {H_OP: op, H_PSOURCE: src.encode(), **extra}
    return Record("PARK.g", 0, offset, key, value, None, headers, 1000 + offset)


def test_park_fail_resolve_replays_to_the_waiting_records_in_order() -> None:
    book = ParkBook()
    book.apply(_event(0, b"park", "orders/3/10", value=b"a", **{H_PCOUNT: b"1", H_PDUE: b"500"}))
    book.apply(_event(1, b"park", "orders/3/12", value=b"b"))
    book.apply(_event(2, b"park", "orders/3/12", value=b"b"))  # repeated after a crash: once
    book.apply(_event(3, b"park", "orders/3/15", value=b"c", **{"app": b"x"}))
    pk = book.keys[(TP, b"k")]
    assert [(r.offset, r.value) for r in pk.pending] == [(10, b"a"), (12, b"b"), (15, b"c")]
    assert (pk.count, pk.due_ms, pk.since_ms) == (1, 500, 1000)
    assert pk.pending[2].headers == {"app": b"x"}, "the park headers are not the record's"
    book.apply(_event(4, b"fail", "orders/3/10", **{H_PCOUNT: b"2", H_PDUE: b"900"}))
    assert (pk.count, pk.due_ms) == (2, 900)
    book.apply(_event(5, b"resolved", "orders/3/10", **{H_HOW: b"ok"}))
    assert [r.offset for r in pk.pending] == [12, 15]
    assert pk.count == 0
    assert [book.seen(TP, o) for o in (10, 11, 15, 16)] == [True, False, True, False]
    book.apply(_event(6, b"resolved", "orders/3/15", **{H_HOW: b"dlq"}))
    assert not book.keys, "released once nothing waits"
    assert book.seen(TP, 12), "a parked source stays known: a redelivery after a crash is not parked again"


def test_unpark_resets_the_count_of_every_partition_or_one() -> None:
    book = ParkBook()
    book.apply(_event(0, b"park", "orders/3/1", **{H_PCOUNT: b"5", H_PDUE: b"0"}))
    book.apply(_event(1, b"park", "orders/4/1", **{H_PCOUNT: b"5", H_PDUE: b"0"}))
    book.apply(_event(2, b"unpark", "orders/4/-1"))
    assert book.keys[(("orders", 4), b"k")].count == 0
    assert book.keys[(TP, b"k")].count == 5
    book.apply(Record("PARK.g", 0, 3, b"k", b"", None, {H_OP: b"unpark"}, 0))
    assert book.keys[(TP, b"k")].count == 0


def test_parse_source() -> None:
    assert parse_source(b"a/b/7/12") == ("a/b", 7, 12)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([b"park", b"fail", b"resolved", b"unpark", b"x", b""]),
            st.text(max_size=12),
            st.one_of(st.none(), st.binary(max_size=3)),
            st.binary(max_size=4),
        ),
        max_size=30,
    )
)
def test_malformed_events_never_break_the_replay(
    events: list[tuple[bytes, str, bytes | None, bytes]],
) -> None:
    book = ParkBook()
    for i, (op, src, key, count) in enumerate(events):
        headers = {H_OP: op, H_PSOURCE: src.encode(), H_PCOUNT: count, H_PDUE: count}
        book.apply(Record("PARK.g", 0, i, key, b"v", None, headers, i))
    for pk in book.keys.values():
        assert pk.pending, "a key is parked only while something waits"
        offsets = [r.offset for r in pk.pending]
        assert len(set(offsets)) == len(offsets)


def test_a_consumers_own_parks_make_the_same_book_as_their_replay() -> None:
    """Parker hands its acknowledged ``park`` events to ``ParkBook.add`` with the record they park (no
    re-parsing); a replay of the same events must give the same book."""
    from sluice.client.consumer.parker import _park

    originals = [
        Record("orders", 3, 10, b"k", b"a", "t", {"app": b"x"}, 5),
        Record("orders", 3, 12, b"k", b"b", None, {H_PCOUNT: b"7", "app": b"y"}, 6),  # a park header
        Record("orders", 3, 12, b"k", b"b", None, {}, 6),  # the same source again: once
        Record("orders", 1, 4, b"j", b"c", None, {}, 7),
    ]
    events = [_park(originals[0], 1, 500), *(_park(r) for r in originals[1:])]
    replayed, direct = ParkBook(), ParkBook()
    for offset, (key, value, tag, headers, parked) in enumerate(events):
        event = Record("PARK.g", 0, offset, key, value, tag, headers, 1000 + offset)
        replayed.apply(event)
        assert parked is not None
        direct.add(parked._replace(timestamp=event.timestamp), event)
    assert direct.keys == replayed.keys
    assert (direct.sources, direct.max_source) == (replayed.sources, replayed.max_source)
    assert [r.headers for r in direct.keys[(TP, b"k")].pending] == [{"app": b"x"}, {"app": b"y"}]


def test_a_resolved_below_the_counted_head_keeps_its_count() -> None:
    """The push side writes a new head's ``fail`` before the ``resolved`` of the prefix that went to the
    DLQ ahead of it: the replay must keep that head's count (it was 0, and a held key came back parked)."""
    book = ParkBook()
    for o in (1, 2, 3):
        book.apply(_event(o, b"park", f"orders/3/{o}", **({H_PCOUNT: b"2", H_PDUE: b"0"} if o == 1 else {})))
    book.apply(_event(4, b"fail", "orders/3/3", **{H_PCOUNT: b"2", H_PDUE: b"0"}))
    book.apply(_event(5, b"resolved", "orders/3/2", **{H_HOW: b"dlq"}))
    pk = book.keys[(TP, b"k")]
    assert ([r.offset for r in pk.pending], pk.count) == ([3], 2)
    book.apply(_event(6, b"resolved", "orders/3/3", **{H_HOW: b"dlq"}))
    assert not book.keys
