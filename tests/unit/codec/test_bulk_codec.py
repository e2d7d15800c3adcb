"""The column-wise codec paths against the record-wise ones they stand for: ``BatchBuilder.extend``
encodes byte for byte what ``append`` record by record does, and ``decode_columns`` gives exactly the
records ``decode_records`` gives (compressed batches, several batches, a start offset inside a batch)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec import batch as b
from sluice.codec.batch.compression import codec_id
from sluice.codec.batch.layout import COLUMN_BYTES, NO_KEY, assemble, encode_headers
from tests.examples import examples

record_st = st.tuples(
    st.binary(max_size=32),
    st.one_of(st.none(), st.binary(max_size=8)),
    st.one_of(st.none(), st.sampled_from(["tagA", "tagB"])),
    st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "b"]), st.binary(max_size=4), max_size=2)),
)
Rec = tuple[bytes, bytes | None, str | None, dict[str, bytes] | None]


def _extend(builder: b.BatchBuilder, recs: list[Rec], ts: int) -> int:
    values = [r[0] for r in recs]
    keys = [r[1] for r in recs]
    key_lengths = [NO_KEY if k is None else len(k) for k in keys]
    headers = [encode_headers(r[3]) if r[3] else b"" for r in recs]
    pairs = {p for r in recs if r[3] for p in r[3].items()}
    tags = [r[2] for r in recs]
    size = sum(
        COLUMN_BYTES + len(v) + max(k, 0) + len(h)
        for v, k, h in zip(values, key_lengths, headers, strict=True)
    )
    any_key = any(k is not None for k in keys)
    return builder.extend(
        values,
        keys if any_key else None,
        [len(v) for v in values],
        key_lengths if any_key else None,
        size,
        ts,
        headers if any(headers) else None,
        pairs,
        tags if any(tags) else None,
    )


@settings(max_examples=examples(80), deadline=None)
@given(st.lists(st.lists(record_st, max_size=12), min_size=1, max_size=4), st.sampled_from(["none", "zstd"]))
def test_extend_encodes_what_append_does(calls: list[list[Rec]], compression: str) -> None:
    codec = codec_id(compression)
    one, many = b.BatchBuilder(codec), b.BatchBuilder(codec)
    for i, call in enumerate(calls):
        ts = 1_000 + 3 * i
        first = len(many)
        assert _extend(many, call, ts) == first
        for value, key, tag, headers in call:
            one.append(value, key, tag, headers, ts)
        assert many.size == one.size
    if len(one):
        assert many.build((5, 0, 9)) == one.build((5, 0, 9))


@settings(max_examples=examples(80), deadline=None)
@given(
    st.lists(st.lists(record_st, min_size=1, max_size=10), min_size=1, max_size=4),
    st.sampled_from(["none", "zstd"]),
    st.integers(0, 30),
)
def test_decode_columns_gives_what_decode_records_gives(
    batches: list[list[Rec]], compression: str, start: int
) -> None:
    raw = bytearray()
    base = 0
    for i, recs in enumerate(batches):
        one = bytearray(
            b.encode_records([(v, k, t, h, 50 + i) for v, k, t, h in recs], codec=codec_id(compression))
        )
        b.stamp(one, 0, base, 7, 1)
        raw += one
        base += len(recs)
    data = bytes(raw)
    records = b.decode_records(data, "t", 2, start)
    cols = b.decode_columns(data, "t", 2, start)
    assert cols.records() == records
    assert len(cols) == len(records)
    assert (cols.offsets, cols.keys, cols.values, cols.timestamps) == (
        [r.offset for r in records],
        [r.key for r in records],
        [r.value for r in records],
        [r.timestamp for r in records],
    )
    assert cols.tags == [r.tag for r in records]
    assert cols.headers == [r.headers for r in records]
    back = b.RecordColumns.of_records("t", 2, records)
    assert back.records() == records
    if len(records) > 2:
        head, tail = cols.cut(0, 2), cols.cut(2, len(cols))
        head.extend(tail)
        assert head.records() == records


def test_decode_columns_offsets_with_gaps_and_timestamps_apart() -> None:
    """``decode_columns`` makes a dense batch's offsets from a range and a batch's one shared timestamp
    by repetition; a batch with gaps (tag-filtered) and records stamped at different times take the
    general way, and the three forms agree with ``decode_records``."""
    recs = [(b"v%d" % i, b"k%d" % i, "a" if i % 3 else "b", None, 100 + 300 * i) for i in range(10)]
    raw = bytearray(b.encode_records(recs))
    b.stamp(raw, 0, 1_000, 7, 1)
    spread = bytes(raw)
    filtered = b.filter_batch(spread, 0, b.read_header(spread), frozenset({"a"}))
    assert filtered is not None
    same = bytearray(b.encode_records([(v, k, t, h, 42) for v, k, t, h, _ in recs]))
    b.stamp(same, 0, 2_000, 7, 1)
    cases = (
        (spread, list(range(1_000, 1_010)), [100 + 300 * i for i in range(10)]),
        (filtered, [1_000 + i for i in range(10) if i % 3], [100 + 300 * i for i in range(10) if i % 3]),
        (bytes(same), list(range(2_000, 2_010)), [42] * 10),
    )
    for data, offsets, timestamps in cases:
        cols = b.decode_columns(data, "t", 0)
        assert (cols.offsets, cols.timestamps) == (offsets, timestamps)
        assert cols.records() == b.decode_records(data, "t", 0)


def test_assemble_from_parts_frames_what_one_body_does() -> None:
    """``assemble`` given the body in parts (what ``BatchBuilder.build`` passes) frames the same bytes,
    CRC included, as given the parts joined."""
    parts = (b"\x00\x00", b"columns", b"", b"keys" * 50, b"values" * 300)
    args = (3, 2, 1_000, 1_005, 2)
    assert assemble(*args, parts, producer=(4, 1, 7)) == assemble(*args, b"".join(parts), producer=(4, 1, 7))


def test_decode_columns_timestamps_made_when_read_across_cuts_and_extends() -> None:
    """``decode_columns`` keeps each batch's timestamp deltas until ``timestamps`` is read; a cut
    through and across batches, and an extend by decoded or by eager columns, give the timestamps
    ``decode_records`` gives."""
    raw = bytearray()
    for i in range(3):
        one = bytearray(b.encode_records([(b"v", b"k", None, None, 1_000 * i + 7 * j) for j in range(5)]))
        b.stamp(one, 0, 5 * i, 7, 1)
        raw += one
    data = bytes(raw)
    want = [r.timestamp for r in b.decode_records(data, "t", 0)]
    for start, end in ((0, 15), (3, 12), (5, 10), (6, 7), (14, 15), (4, 4)):
        assert b.decode_columns(data, "t", 0).cut(start, end).timestamps == want[start:end]
    head, tail = b.decode_columns(data, "t", 0).cut(0, 6), b.decode_columns(data, "t", 0).cut(6, 15)
    head.extend(tail)
    assert head.timestamps == want
    eager = b.RecordColumns.of_records("t", 0, b.decode_records(data, "t", 0)[:6])
    eager.extend(b.decode_columns(data, "t", 0).cut(6, 15))
    assert eager.timestamps == want
    lazy = b.decode_columns(data, "t", 0).cut(0, 6)
    lazy.extend(b.RecordColumns.of_records("t", 0, b.decode_records(data, "t", 0)[6:]))
    assert lazy.timestamps == want
    assert b.decode_columns(data, "t", 0, 3).timestamps == want[3:]


def test_fixed_size_records_decode_as_sliced_ones() -> None:
    """A batch whose keys share one length and values another is unpacked in one call; every other
    shape (a length differing in one record, absent keys, empty keys or values) is sliced. Both give
    the records that were encoded, as ``bytes``, by ``decode_columns`` and ``decode_records`` alike."""
    shapes: list[list[tuple[bytes, bytes | None]]] = [
        [(b"v%03d" % i, b"k%02d" % i) for i in range(n)] for n in (1, 2, 7, 50)
    ]
    shapes.append([(b"%05d" % i, b"k") for i in range(9_000)])  # more records than formats are kept for
    shapes += [
        [(b"v%03d" % i, b"k%d" % i) for i in range(12)],  # keys of 2 and 3 bytes
        [(b"v%d" % i, b"k%02d" % i) for i in range(12)],  # values of 2 and 3 bytes
        [(b"same", None) for _ in range(5)],
        [(b"same", b"") for _ in range(5)],
        [(b"", b"key") for _ in range(5)],
        [(b"v1", b"k1"), (b"v2", None), (b"v3", b"k3")],
    ]
    for recs in shapes:
        raw = bytearray(b.encode_records([(v, k, None, None, 9) for v, k in recs]))
        b.stamp(raw, 0, 100, 7, 1)
        data = bytes(raw)
        cols = b.decode_columns(data, "t", 0)
        assert (cols.values, cols.keys) == ([v for v, _ in recs], [k for _, k in recs])
        assert all(type(v) is bytes for v in cols.values)
        assert [(r.value, r.key) for r in b.decode_records(data, "t", 0)] == recs
    # Headers follow the values: where they start is where the unpacked values end.
    recs_h = [(b"v%03d" % i, b"k%02d" % i, None, {"h": b"%d" % i}, 9) for i in range(6)]
    raw = bytearray(b.encode_records(recs_h))
    # Another buffer type is sliced as before: its slices are of its type, which unpacking would change.
    others: list[object] = [bytearray(raw), memoryview(bytes(raw))]
    for other in others:
        values: list[object] = list(b.decode_columns(other, "t", 0).values)  # type: ignore[arg-type]
        assert [type(v) for v in values] == [type(other)] * 6
    b.stamp(raw, 0, 100, 7, 1)
    cols = b.decode_columns(bytes(raw), "t", 0)
    assert cols.headers == [{"h": b"%d" % i} for i in range(6)]
    assert [r.headers for r in b.decode_records(bytes(raw), "t", 0)] == cols.headers
