"""The Spark source's pure parts: option parsing and offset planning."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.common.client_security import TLSConfig
from sluice.errors import InvalidArgument, InvalidFilter, InvalidTopic
from sluice.spark.options import parse_options
from sluice.spark.planning import OffsetRange, limit_offsets, split

BASE = {"bootstrap": "127.0.0.1:7600", "topic": "a,b"}


def test_defaults_and_case_insensitive_keys() -> None:
    o = parse_options({**BASE, "MaxRecordsPerPartition": "10"}, streaming=False)
    assert o.topics == ("a", "b")
    assert o.starting == "earliest"
    assert o.ending == "latest"
    assert o.max_records_per_partition == 10
    assert parse_options(BASE, streaming=True).starting == "latest"


def test_tls_and_token_options() -> None:
    plain = parse_options(BASE, streaming=False)
    assert plain.tls is None
    assert plain.token is None
    o = parse_options(
        {**BASE, "tlsCa": "/ca.crt", "tlsCert": "/me.crt", "tlsKey": "/me.key", "token": "t"}, streaming=False
    )
    assert o.tls == TLSConfig(ca="/ca.crt", cert="/me.crt", key="/me.key")
    assert o.token == "t"
    with pytest.raises(InvalidArgument, match="go together"):
        parse_options({**BASE, "tlsCert": "/me.crt"}, streaming=False)


def test_json_offsets() -> None:
    o = parse_options({**BASE, "startingOffsets": '{"a": {"0": 5, "1": -2}}'}, streaming=False)
    assert o.starting == {"a/0": 5, "a/1": -2}


@pytest.mark.parametrize(
    ("opts", "error", "match"),
    [
        ({"topic": "a"}, InvalidArgument, "bootstrap is required"),
        ({"bootstrap": "x"}, InvalidArgument, "topic is required"),
        ({**BASE, "startingOffsets": "{bad json"}, InvalidArgument, "startingOffsets"),
        ({**BASE, "startingOffsets": '{"zzz": {"0": 1}}'}, InvalidArgument, "not among the subscribed"),
        ({**BASE, "startingOffsets": '{"a": {"0": -5}}'}, InvalidArgument, "negative"),
        ({**BASE, "endingOffsets": "earliest"}, InvalidArgument, "cannot be 'earliest'"),
        ({**BASE, "maxRecordsPerTrigger": "0"}, InvalidArgument, "must be positive"),
        ({**BASE, "failOnDataLoss": "maybe"}, InvalidArgument, "not a boolean"),
        ({**BASE, "filter": "a && b"}, InvalidFilter, "not a tag"),
        ({**BASE, "topic": "bad topic"}, InvalidTopic, "invalid topic name"),
        ({**BASE, "colour": "red"}, InvalidArgument, "unknown option"),
    ],
)
def test_bad_options_fail_with_typed_errors(opts: dict[str, str], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        parse_options(opts, streaming=False)


def test_split_covers_the_range_exactly() -> None:
    pieces = split(OffsetRange("t", 0, 3, 25), 10)
    assert [(p.start, p.end) for p in pieces] == [(3, 13), (13, 23), (23, 25)]
    assert split(OffsetRange("t", 0, 5, 5), 10) == []


@given(
    st.dictionaries(st.sampled_from(["t/0", "t/1", "t/2", "u/0"]), st.integers(0, 1000), min_size=1),
    st.integers(1, 500),
    st.data(),
)
def test_read_limit_is_exact_and_never_overshoots(
    start: dict[str, int], limit: int, data: st.DataObject
) -> None:
    latest = {k: v + data.draw(st.integers(0, 1000)) for k, v in start.items()}
    end = limit_offsets(start, latest, limit)
    taken = sum(end[k] - start[k] for k in start)
    backlog = sum(latest[k] - start[k] for k in start)
    assert taken == min(limit, backlog)
    assert all(start[k] <= end[k] <= latest[k] for k in start)
