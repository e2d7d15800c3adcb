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
