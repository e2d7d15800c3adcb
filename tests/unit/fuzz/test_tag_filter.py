"""The filter parsers under any text: a filter or a typed refusal, nothing else; a parsed tag filter
means exactly the tags it was given (``codec/filter.py``, ``codec/sql_filter.py``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.codec.filter import MATCH_ALL, parse_filter, sql_expression
from sluice.errors import InvalidFilter, LimitExceeded

TAG_ALPHABET = st.sampled_from("abcXYZ019._:/-")
tag_st = st.text(TAG_ALPHABET, min_size=1, max_size=12)
#: What may surround and separate tags: spaces, tabs, stray bars, unicode.
noise_st = st.text(st.sampled_from(" \t|*é\n"), max_size=3)


@given(st.text(max_size=200))
def test_any_text_parses_or_is_refused_typed(expression: str) -> None:
    try:
        parsed = parse_filter(expression)
    except InvalidFilter:
        return  # typed: the wire carries its code
    # Parsed: its canonical form parses to the same filter (what the broker stores and echoes).
    assert parse_filter(parsed.expression) == parsed


@given(st.lists(tag_st, min_size=1, max_size=8), st.lists(st.sampled_from([" ", "\t", ""]), max_size=8))
def test_a_list_of_tags_means_exactly_those_tags(tags: list[str], spaces: list[str]) -> None:
    pad = [spaces[i % len(spaces)] if spaces else "" for i in range(len(tags))]
    expression = "||".join(f"{p}{t}{p}" for p, t in zip(pad, tags, strict=True))
    parsed = parse_filter(expression)
    assert parsed.tags == frozenset(tags)
    for tag in tags:
        assert parsed.matches(tag)
    assert not parsed.matches(None)
    assert not parsed.matches("not-" + max(tags, key=len) + "!")  # '!' is never in a tag


@given(st.lists(tag_st, max_size=5), st.lists(tag_st, max_size=5))
def test_a_star_among_tags_matches_everything(before: list[str], after: list[str]) -> None:
    assert parse_filter(" || ".join([*before, "*", *after])) == MATCH_ALL


@given(st.lists(tag_st, min_size=1, max_size=4), noise_st)
def test_an_empty_part_is_refused(tags: list[str], noise: str) -> None:
    """``a || || b`` is a typo, not "a or b or everything"."""
    if "*" in noise:
        return
    try:
        parse_filter(" || ".join(tags) + " ||" + noise.replace("|", ""))
    except InvalidFilter:
        return
    raise AssertionError("a trailing '||' with nothing after it was accepted")


SQL_WORDS = st.sampled_from(
    [
        *("a", "b", "=", "<>", "<", ">=", "BETWEEN", "AND", "OR", "NOT", "IN", "(", ")", ",", "IS", "NULL"),
        *("TRUE", "FALSE", "'x'", "'", "1", "-2.5", "1e309", "9" * 40, "%SQL92%", "\x00", "é"),
    ]
)


@given(st.lists(SQL_WORDS, max_size=40), st.text(max_size=20))
def test_any_sql_text_compiles_or_is_refused_typed(words: list[str], noise: str) -> None:
    """SQL92 filters (``codec/sql_filter.py``) under near-grammatical and random text: a compiled filter
    that evaluates any headers without raising, or a typed refusal."""
    try:
        parsed = parse_filter(sql_expression(" ".join(words) + noise))
    except (InvalidFilter, LimitExceeded):
        return
    assert parsed.sql is not None
    for headers in ({}, {"a": b"1"}, {"a": b"x", "b": b"2.5"}, {"a": b"\xff", "b": b""}):
        parsed.matches(None, headers)
