"""The Kafka-source options, minPartitions splits and the sink's options and schema checks (pure)."""

from __future__ import annotations

import pytest

from sluice.errors import InvalidArgument
from sluice.spark.options import parse_options
from sluice.spark.planning import OffsetRange, split_min_partitions
from sluice.spark.reading import arrow_schema, schema_ddl

BASE = {"bootstrap": "127.0.0.1:7600", "topic": "t"}


def test_timestamp_options_parse() -> None:
    o = parse_options(
        {**BASE, "startingTimestamp": "1700000000000", "startingOffsetsByTimestamp": '{"t": {"1": 5}}'},
        streaming=False,
    )
    assert o.starting_timestamp == 1_700_000_000_000
    assert o.starting_by_timestamp == {"t/1": 5}
    assert not o.include_headers
    assert parse_options({**BASE, "includeHeaders": "true"}, streaming=True).include_headers


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"startingTimestamp": "yesterday"}, "startingTimestamp"),
        ({"startingTimestamp": "-1"}, "startingTimestamp"),
        ({"startingOffsetsByTimestamp": '{"other": {"0": 1}}'}, "subscribed topic"),
        ({"startingOffsetsByTimestamp": '{"t": {"0": "x"}}'}, "partition -> ms"),
        ({"minPartitions": "0"}, "minPartitions"),
        ({"includeHeaders": "maybe"}, "includeHeaders"),
    ],
)
def test_bad_kafka_options_are_typed_errors(extra: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_options({**BASE, **extra}, streaming=False)


def test_min_partitions_splits_in_proportion_and_is_a_true_minimum() -> None:
    ranges = [OffsetRange("t", 0, 0, 250), OffsetRange("t", 1, 100, 150)]
    out = split_min_partitions(ranges, 6)
    assert [(r.partition, r.start, r.end) for r in out] == [
        (0, 0, 50), (0, 50, 100), (0, 100, 150), (0, 150, 200), (0, 200, 250), (1, 100, 150),
    ]  # fmt: skip
    five = [OffsetRange("t", p, 0, 50) for p in range(5)]
    assert len(split_min_partitions(five, 7)) >= 7  # rounding to nearest would give 5
    assert split_min_partitions(five, 3) == five  # already enough
    assert split_min_partitions([OffsetRange("t", 0, 0, 2)], 10) == [
        OffsetRange("t", 0, 0, 1), OffsetRange("t", 0, 1, 2),
    ]  # fmt: skip  # never an empty range
    assert split_min_partitions([OffsetRange("t", 0, 5, 5)], 4) == []


def test_the_schema_is_kafkas_order_and_headers_are_optional() -> None:
    assert arrow_schema(False).names == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "tag",
    ]  # fmt: skip
    assert arrow_schema(True).names[7] == "headers"
    assert "`headers` array<struct<key:string,value:binary>>" in schema_ddl(True)


def test_sink_options_and_schema_checks() -> None:
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructType

    from sluice.spark.sink import check_schema, parse_sink_options

    opts = parse_sink_options({"bootstrap": "h:1", "topic": "t", "checkpointLocation": "/x"})
    assert (opts.topic, opts.acks) == ("t", -1)
    assert parse_sink_options({"bootstrap": "h:1", "acks": "1"}).acks == 1
    assert parse_sink_options({"bootstrap": "h:1", "compression": "ZSTD"}).compression == "zstd"
    with pytest.raises(InvalidArgument, match="unknown compression"):
        parse_sink_options({"bootstrap": "h:1", "compression": "snappy"})
    with pytest.raises(InvalidArgument, match="unknown option"):
        parse_sink_options({"bootstrap": "h:1", "kafka.bootstrap.servers": "x"})
    extras = (
        StructType().add("value", StringType()).add("offset", LongType()).add("timestampType", IntegerType())
    )
    check_schema(extras, opts)  # columns the sink does not take are ignored
    with pytest.raises(InvalidArgument, match="column 'partition' is bigint"):
        check_schema(StructType().add("value", BinaryType()).add("partition", LongType()), opts)
    assert "password" not in repr(parse_sink_options({"bootstrap": "h:1", "username": "u", "password": "p"}))
