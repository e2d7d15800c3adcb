"""Where an SQL92 filter is configured: the Spark source (``filter`` + ``filterType``), track states."""

from __future__ import annotations

import pytest

from sluice.cli.track import CONSUMED, CONSUMED_BUT_FILTERED, track_state
from sluice.codec.filter import sql_expression
from sluice.errors import InvalidArgument, InvalidFilter
from sluice.spark.options import parse_options

BASE = {"bootstrap": "127.0.0.1:1", "topic": "t"}


def test_spark_filter_type_sql() -> None:
    opts = parse_options({**BASE, "filter": "region = 'eu'", "filterType": "sql"}, streaming=False)
    assert opts.filter == sql_expression("region = 'eu'")
    assert parse_options({**BASE, "filter": "tagA"}, streaming=False).filter == "tagA"
    with pytest.raises(InvalidFilter, match="column 10"):
        parse_options({**BASE, "filter": "region > 'eu'", "filterType": "SQL"}, streaming=False)
    with pytest.raises(InvalidArgument, match="filterType"):
        parse_options({**BASE, "filter": "x", "filterType": "regex"}, streaming=False)


def test_track_state_reads_headers_for_an_sql_filter() -> None:
    expr = sql_expression("region = 'eu'")
    assert track_state(5, None, expr, 10, headers={"region": b"eu"}) == CONSUMED
    assert track_state(5, None, expr, 10, headers={"region": b"us"}) == CONSUMED_BUT_FILTERED
    assert track_state(5, "tagA", expr, 10, headers={}) == CONSUMED_BUT_FILTERED
