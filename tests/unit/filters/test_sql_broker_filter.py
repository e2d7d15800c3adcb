"""The broker's SQL92 filtering over raw log batches: prune from the header summary, pass through,
cut mixed batches, advance past everything walked, decode no record it does not have to."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sluice.broker.filtering import filter_chunk
from sluice.codec.batch import BatchBuilder, decode_records, iter_headers, read_header, stamp, validate_batch
from sluice.codec.batch.layout import Headers
from sluice.codec.sql_filter import compile_sql


def _batch(headers: list[Headers | None], tag: str | None = None) -> bytes:
    b = BatchBuilder()
    for i, h in enumerate(headers):
        b.append(f"v{i}".encode(), None, tag, h, 1_000 + i)
    return b.build()


def _log(*batches: bytes) -> bytes:
    out = bytearray()
    offset = 0
    for raw in batches:
        validate_batch(raw, 0, 1 << 20, require_dense=True)  # a batch with a summary is a valid batch
        buf = bytearray(raw)
        stamp(buf, 0, offset, 5, 0)
        out += buf
        offset += read_header(raw).record_count
    return bytes(out)


Raw = dict[bytes, bytes]


def _counted(fn: Callable[[Raw], bool], calls: list[Raw]) -> Callable[[Raw], bool]:
    def counted(h: dict[bytes, bytes]) -> bool:
        calls.append(h)
        return fn(h)

    return counted


EU: Headers = {"region": b"eu", "prio": b"1"}
US: Headers = {"region": b"us", "prio": b"9"}


def test_prunes_passes_cuts_and_advances() -> None:
    first_us = _batch([US] * 10)
    data = _log(_batch([EU] * 10), first_us, _batch([EU, US] * 5), _batch([None] * 10))
    calls: list[dict[bytes, bytes]] = []
    sql = compile_sql("region = 'us' AND prio > 5")
    counting = dataclasses.replace(sql, matches_raw=_counted(sql.matches_raw, calls))
    out = filter_chunk(data, 0, frozenset(), limit=1 << 20, min_one=True, sql=counting)
    assert out.next_offset == 40
    assert len(out.batches) == 2
    assert out.batches[0] == data[len(first_us) : 2 * len(first_us)]  # passed through as logged
    got = [(r.offset, r.headers) for b in out.batches for r in decode_records(b, "t", 0)]
    assert got == [(o, US) for o in [*range(10, 20), *range(21, 30, 2)]]
    # The all-EU batch was pruned from its summary and the header-less one answered once
    # (``matches_empty``): only the 20 records of the two other batches were decoded.
    assert len(calls) == 20


def test_a_filter_matching_nothing_decodes_nothing_and_still_advances() -> None:
    data = _log(*[_batch([EU, {"region": b"ap", "prio": b"3"}] * 50) for _ in range(5)])
    sql = compile_sql("region = 'us'")
    calls: list[dict[bytes, bytes]] = []
    counting = dataclasses.replace(sql, matches_raw=_counted(sql.matches_raw, calls))
    out = filter_chunk(data, 0, frozenset(), limit=1 << 20, min_one=True, sql=counting)
    assert out.batches == []
    assert out.next_offset == 500
    assert calls == []


def test_records_without_headers_match_by_null_rules() -> None:
    data = _log(_batch([None, EU, None]))
    out = filter_chunk(data, 0, frozenset(), 1 << 20, True, compile_sql("region IS NULL"))
    assert [r.offset for b in out.batches for r in decode_records(b, "t", 0)] == [0, 2]


def test_tag_filter_still_passes_a_batch_with_a_summary_through() -> None:
    raw = _batch([EU] * 4, tag="a")
    data = _log(raw)
    out = filter_chunk(data, 0, frozenset({"a"}), 1 << 20, True)
    assert out.batches == [data]  # byte for byte: the summary entry is no record's tag
    assert [r.tag for r in decode_records(data, "t", 0)] == ["a"] * 4


def test_limit_and_min_one_hold_for_sql() -> None:
    data = _log(*[_batch([US] * 10) for _ in range(3)])
    one = next(iter_headers(data))[1].length
    out = filter_chunk(data, 0, frozenset(), one + 10, False, compile_sql("region = 'us'"))
    assert out.stopped_on_limit
    assert out.next_offset == 10


def _raw_blob(pairs: list[tuple[bytes, bytes]]) -> bytes:
    """A headers blob as a raw client could write it (the SDK encodes a dict: no repeated names)."""
    import struct

    out = [struct.pack("<H", len(pairs))]
    for name, value in pairs:
        out += [struct.pack("<H", len(name)), name, struct.pack("<I", len(value)), value]
    return b"".join(out)


def test_the_column_walk_stops_early_only_when_no_record_repeats_a_wanted_name() -> None:
    """The walk stops after the last header the filter reads; a record repeating that name later
    (its last value counts, as ``decode_headers`` says), or a value that merely contains the name's
    encoding, makes it fall back: the answer is always the record-by-record one."""
    from sluice.codec.header_columns import header_columns
    from sluice.codec.sql_filter import raw_headers

    def check(blobs: list[bytes]) -> tuple[list[bytes | None], bool]:
        starts = [0]
        for b in blobs:
            starts.append(starts[-1] + len(b))
        buf = b"".join(blobs)
        cols = header_columns(buf, starts, ["a"])
        expected = [raw_headers(buf, starts[i], starts[i + 1]).get(b"a") for i in range(len(blobs))]
        if cols is not None:
            assert cols[0].per_record() == expected
        return expected, cols is not None

    plain = [_raw_blob([(b"a", b"1"), (b"b", str(i).encode())]) for i in range(40)]
    assert check(plain) == ([b"1"] * 40, True)  # read column-wise, stopping after "a"
    repeated = list(plain)
    repeated[7] = _raw_blob([(b"a", b"1"), (b"a", b"2")])
    values, columnar = check(repeated)
    assert values[7] == b"2"
    assert not columnar
    lookalike = list(plain)
    lookalike[3] = _raw_blob([(b"a", b"1"), (b"b", b"\x01\x00a")])
    values, columnar = check(lookalike)
    assert values[3] == b"1"
    assert not columnar
