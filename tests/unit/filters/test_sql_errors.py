"""Bad SQL92 filters: a typed error (INVALID_FILTER) with the position or the limit, never a crash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.filter import SQL_PREFIX, parse_filter, sql_expression
from sluice.codec.filter_limits import FilterLimits
from sluice.codec.sql_filter import compile_sql
from sluice.errors import InvalidFilter

MAX_SQL_LENGTH = FilterLimits().max_length
MAX_SQL_DEPTH = FilterLimits().max_depth


@pytest.mark.parametrize(
    ("expr", "column", "words"),
    [
        ("a > 'x'", 5, "compares numbers"),
        ("a BETWEEN 'a' AND 3", 11, "compares numbers"),
        ("a IN (1, 'x')", 10, "mixes strings and numbers"),
        ("a == 1", 4, "unexpected"),
        ("a = 1 AND", 7, "ends too early"),
        ("a = 1 # 2", 7, "unexpected character"),
        ("(a = 1", None, "ends too early"),
    ],
)
def test_errors_carry_the_position(expr: str, column: int | None, words: str) -> None:
    with pytest.raises(InvalidFilter) as info:
        compile_sql(expr)
    assert words in info.value.message
    if column is not None:
        assert info.value.fields["column"] == column
        assert f"column {column}" in info.value.message


def test_limits() -> None:
    with pytest.raises(InvalidFilter, match="exceeds the limit") as info:
        compile_sql("a = 1 OR " * (MAX_SQL_LENGTH // 9) + "a = 1")
    assert info.value.fields["limit"] == MAX_SQL_LENGTH
    with pytest.raises(InvalidFilter, match="nests deeper") as info:
        compile_sql("NOT " * MAX_SQL_DEPTH + "a = 1")
    assert info.value.fields["limit"] == MAX_SQL_DEPTH
    compile_sql("NOT " * (MAX_SQL_DEPTH - 2) + "a = 1")  # within the limit
    with pytest.raises(InvalidFilter, match="empty"):
        compile_sql("   ")


def test_prefix_and_tag_filters_stay_apart() -> None:
    f = parse_filter(sql_expression("  a = 'x' "))
    assert f.expression == f"{SQL_PREFIX} a = 'x'"
    assert f.tags is None
    assert f.sql is not None
    assert not f.matches_all
    assert f.matches(None, {"a": b"x"})
    assert not f.matches("x", {})
    assert parse_filter(f.expression) == f  # normalised form parses to itself (cached object)
    with pytest.raises(InvalidFilter):
        parse_filter(f"{SQL_PREFIX} a >")
    # '%' is outside the tag alphabet: the prefix never was a valid tag filter.
    with pytest.raises(InvalidFilter):
        parse_filter("%SQL92%")  # empty SQL


def test_identifiers_literals_and_keywords() -> None:
    f = compile_sql("android = 'it''s' AND region.code IS NULL")  # 'and' inside a name is a name
    assert f.matches({"android": b"it's"})
    assert compile_sql("a = -1.5e1").matches({"a": b"-15"})
    assert compile_sql("a <> 'x'").matches({"a": b"y"})
    assert not compile_sql("a <> 'x'").matches({})
    assert compile_sql("not a between 1 and 2").matches({"a": b"3"})
    assert not compile_sql("not a between 1 and 2").matches({"a": b"abc"})
    assert compile_sql("true or a = 1").matches_empty


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="ab=<>'() ,.01-NOTANDORISNULLINBETWEENtruefalse\n\t#", max_size=60))
def test_any_text_compiles_or_is_refused(text: str) -> None:
    try:
        f = compile_sql(text)
    except InvalidFilter:
        return
    assert isinstance(f.matches({"a": b"1", "b": b"x"}), bool)
