from __future__ import annotations

import pytest

from sluice.codec.filter import MATCH_ALL, parse_filter
from sluice.errors import InvalidFilter


@pytest.mark.parametrize("expr", ["", "*", "  *  ", "a || *"])
def test_match_all(expr: str) -> None:
    assert parse_filter(expr) is MATCH_ALL
    assert parse_filter(expr).matches(None)


def test_or_expression_matches_exactly_its_tags() -> None:
    f = parse_filter("tagA || tagB")
    assert f.tags == frozenset({"tagA", "tagB"})
    assert f.matches("tagA")
    assert f.matches("tagB")
    assert not f.matches("tagC")
    assert not f.matches(None)
    assert parse_filter("tagB||tagA").expression == "tagA || tagB"


@pytest.mark.parametrize("expr", ["a ||", "|| b", "a | b", "a && b", "tag with space", "a||b||"])
def test_unparseable_filters_are_rejected_with_the_reason(expr: str) -> None:
    with pytest.raises(InvalidFilter, match="is not a tag"):
        parse_filter(expr)
