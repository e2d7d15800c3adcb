"""Tag filtering over raw batches: skip from headers, pass through, rebuild mixed batches."""

from __future__ import annotations

from sluice.broker.filtering import filter_chunk
from sluice.codec.batch import HEADER_SIZE, iter_headers, read_header, stamp

from .helpers import batch, offsets_and_values, tags_of, values


def _log_run(*batches: bytes) -> bytes:
    """Concatenate batches stamped with dense offsets, as the log stores them."""
    out = bytearray()
    offset = 0
    for raw in batches:
        buf = bytearray(raw)
        stamp(buf, 0, offset, 5, 0)
        out += buf
        offset += read_header(raw).record_count
    return bytes(out)


def test_worked_example_skips_keeps_and_rebuilds() -> None:
    data = _log_run(
        batch(values(10, "a"), "a"),
        batch(values(10, "b"), "b"),
        batch(values(10, "m"), ["a", "b"] * 5),
    )
    out = filter_chunk(data, 0, frozenset({"b"}), limit=1 << 20, min_one=True)
    assert out.next_offset == 30
    assert not out.stopped_on_limit
    assert len(out.batches) == 2
    joined = b"".join(out.batches)
    got = offsets_and_values(joined)
    assert [o for o, _ in got] == [*range(10, 20), 21, 23, 25, 27, 29]
    assert set(tags_of(joined)) == {"b"}
    # The all-matching batch is passed through byte for byte.
    pos, second = list(iter_headers(data))[1]
    assert out.batches[0] == data[pos : pos + second.length]
    assert out.out_bytes == sum(len(b) for b in out.batches)


def test_non_matching_batch_is_skipped_from_its_header_alone() -> None:
    skipped = bytearray(_log_run(batch(values(4, "x"), "x")))
    # Scribble over the record columns and data: a decoder would choke, the header walk must not.
    for i in range(HEADER_SIZE + 8, len(skipped)):
        skipped[i] = 0xFF
    out = filter_chunk(bytes(skipped), 0, frozenset({"y"}), limit=1 << 20, min_one=True)
    assert out.batches == []
    assert out.next_offset == 4


def test_nothing_matches_still_advances() -> None:
    data = _log_run(batch(values(3), "a"), batch(values(3)), batch(values(3), "c"))
    out = filter_chunk(data, 0, frozenset({"zzz"}), limit=100, min_one=True)
    assert out.batches == []
    assert out.next_offset == 9


def test_untagged_records_never_match_a_tag_filter() -> None:
    data = _log_run(batch(values(4), [None, "a", None, "a"]))
    out = filter_chunk(data, 0, frozenset({"a"}), limit=1 << 20, min_one=True)
    assert [o for o, _ in offsets_and_values(b"".join(out.batches))] == [1, 3]


def test_limit_stops_before_a_batch_that_does_not_fit() -> None:
    one = batch(values(5, size=100), "a")
    data = _log_run(one, one, one)
    out = filter_chunk(data, 0, frozenset({"a"}), limit=len(one) * 2 + 10, min_one=False)
    assert len(out.batches) == 2
    assert out.stopped_on_limit
    assert out.next_offset == 10  # resumes at the batch that did not fit


def test_min_one_returns_the_first_match_even_over_the_limit() -> None:
    big = batch(values(5, size=1000), "a")
    data = _log_run(batch(values(2), "b"), big, big)
    out = filter_chunk(data, 0, frozenset({"a"}), limit=10, min_one=True)
    assert len(out.batches) == 1
    assert out.out_bytes == len(big)
    assert out.next_offset == 7
    assert out.stopped_on_limit
    # Without min_one nothing fits, but the skipped first batch still counts as walked.
    out = filter_chunk(data, 0, frozenset({"a"}), limit=10, min_one=False)
    assert out.batches == []
    assert out.next_offset == 2
