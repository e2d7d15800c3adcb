"""Limits in the codec: the truncation of echoed inputs, the filter's length and tag count (checked before
the parse cache), and record header limits on the produce path (docs/limits.md)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.codec.batch import HeaderLimits, encode_records, validate_batch
from sluice.codec.filter import parse_filter
from sluice.codec.filter_limits import FilterLimits
from sluice.errors import (
    ECHO_LIMIT,
    MAX_ERROR_MESSAGE_BYTES,
    InvalidFilter,
    LimitExceeded,
    bounded_message,
    echo,
)

MAX_FILTER_TAGS = FilterLimits().max_tags

MAX = 1 << 24


def test_echo_keeps_short_inputs_and_cuts_long_ones_saying_their_length() -> None:
    assert echo("fuzz") == "'fuzz'"
    cut = echo("x" * 1_000_000)
    assert cut == repr("x" * ECHO_LIMIT) + "... (1000000 characters)"
    assert echo(b"\x00" * 500).endswith("... (500 bytes)")
    assert len(echo(list(range(10_000)))) < ECHO_LIMIT + 40


@pytest.mark.parametrize("char", ["x", "é", "💥"])
def test_bounded_message_is_under_its_byte_limit(char: str) -> None:
    message = "unknown group " + char * 100_000
    cut = bounded_message(message)
    assert len(cut.encode()) < 1024
    assert len(cut.encode()) <= MAX_ERROR_MESSAGE_BYTES + 40
    assert cut.endswith(f"(cut: {len(message)} characters)")


def test_an_error_proto_is_bounded() -> None:
    err = InvalidFilter("bad " + "x" * 1_000_000)
    assert len(err.to_proto().message.encode()) < 1024


def test_a_filter_over_its_length_is_refused_before_parsing() -> None:
    with pytest.raises(LimitExceeded, match=r"max_filter_length.*\(1000000 characters\)") as info:
        parse_filter("a" * 1_000_000)
    assert len(str(info.value)) < 1024
    assert parse_filter("a" * 255).tags == frozenset({"a" * 255})


def test_a_filter_naming_too_many_tags_is_refused() -> None:
    ok = " || ".join(f"t{i}" for i in range(MAX_FILTER_TAGS))
    assert len(parse_filter(ok).tags or ()) == MAX_FILTER_TAGS
    with pytest.raises(LimitExceeded, match=f"over the limit of {MAX_FILTER_TAGS}"):
        parse_filter("||".join(f"t{i}" for i in range(MAX_FILTER_TAGS + 1)))


def test_a_bad_tag_in_a_long_filter_is_echoed_cut() -> None:
    with pytest.raises(InvalidFilter) as info:
        parse_filter("!" * 4000)
    assert len(str(info.value)) < 1024


def _batch(headers: dict[str, bytes]) -> bytes:
    return encode_records([(b"v", None, None, {}, 1), (b"w", b"k", None, headers, 2)])


def test_header_limits_refuse_a_record_over_them_only_when_asked() -> None:
    limits = HeaderLimits(max_count=3, max_bytes=100)
    validate_batch(_batch({"a": b"1", "b": b"2", "c": b"3"}), 0, MAX, headers=limits)
    many = _batch({f"h{i}": b"" for i in range(4)})
    with pytest.raises(LimitExceeded, match="max_record_headers=3"):
        validate_batch(many, 0, MAX, headers=limits)
    big = _batch({"a": b"x" * 200})
    with pytest.raises(LimitExceeded, match="max_record_header_bytes=100"):
        validate_batch(big, 0, MAX, headers=limits)
    # Recovery passes no limits: what was accepted before a limit was lowered still reads.
    validate_batch(many, 0, MAX)
    validate_batch(big, 0, MAX)


@given(st.text(max_size=3000), st.integers(min_value=1, max_value=500))
def test_echo_and_bounded_message_are_bounded_for_any_text(text: str, limit: int) -> None:
    echoed = echo(text, limit)
    assert len(echoed) <= len(repr(text[:limit])) + 30
    assert len(bounded_message(text * 3).encode()) <= MAX_ERROR_MESSAGE_BYTES + 40


@given(st.text(alphabet="ab|* \t:/-._", max_size=6000))
def test_any_filter_text_parses_or_gets_a_typed_error(text: str) -> None:
    refusal: Exception | None = None
    try:
        parsed = parse_filter(text)
    except (InvalidFilter, LimitExceeded) as err:
        refusal = err
    if refusal is not None:
        assert len(str(refusal).encode()) < 1024
    else:
        assert parsed.matches_all or parsed.tags
