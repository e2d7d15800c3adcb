"""The filter limits are a service's config (``--max-filter-length`` ...), applied to every parse in the
process at start-up (``server.runtime.service_tls``), and refused below 1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluice.broker.main import parse_config
from sluice.codec.filter import parse_filter, sql_expression
from sluice.codec.filter_limits import FilterLimits, filter_limits, set_filter_limits
from sluice.errors import InvalidArgument, InvalidFilter, LimitExceeded
from sluice.server.runtime import service_tls


@pytest.fixture(autouse=True)
def default_limits() -> Iterator[None]:
    yield
    set_filter_limits(FilterLimits())


def test_a_brokers_configured_limits_are_those_of_every_parse(tmp_path: object) -> None:
    limits = ["--max-filter-length", "40", "--max-filter-tags", "2", "--max-filter-depth", "3"]
    config = parse_config(["--data-dir", str(tmp_path), *limits, "--max-filter-in-list", "2"])
    service_tls(config)
    assert filter_limits() == FilterLimits(max_length=40, max_tags=2, max_depth=3, max_in_list=2)
    with pytest.raises(LimitExceeded, match="limit of 40"):
        parse_filter("x" * 41)
    with pytest.raises(LimitExceeded, match="max_filter_tags"):
        parse_filter("a || b || c")
    with pytest.raises(InvalidFilter, match="max_filter_depth"):
        parse_filter(sql_expression("NOT NOT NOT a = 1"))
    with pytest.raises(InvalidFilter, match="max_filter_in_list"):
        parse_filter(sql_expression("a IN (1, 2, 3)"))
    assert parse_filter("a || b").tags == frozenset({"a", "b"})


def test_a_limit_below_one_is_refused(tmp_path: object) -> None:
    with pytest.raises(InvalidArgument, match="max_filter_depth must be >= 1"):
        parse_config(["--data-dir", str(tmp_path), "--max-filter-depth", "0"]).filter_limits()
