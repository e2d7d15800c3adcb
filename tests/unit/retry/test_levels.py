"""Delay levels, names and retry headers (no cluster)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sluice.cli.dlq_redrive import cursor_of
from sluice.client.consumer import ConsumerConfig
from sluice.client.push import dlq_topic as push_dlq_topic
from sluice.errors import DelayLevelOutOfRange, InvalidArgument, NotADlqTopic
from sluice.retry.levels import (
    DEFAULT_DELAY_LEVELS,
    H_COUNT,
    H_OFFSET,
    H_PARTITION,
    H_TOPIC,
    check_retry_names,
    dlq_group,
    dlq_topic,
    parse_levels,
    redrive_topic,
    retry_info,
    retry_topic,
    sub_dlq_topic,
)


def test_rocketmq_levels_and_progression() -> None:
    levels = parse_levels(DEFAULT_DELAY_LEVELS)
    assert len(levels) == 18
    # The first retry waits at level 3 (10 s); 16 retries climb to the last level (2 h).
    assert [levels.level_for_retry(n) for n in (1, 2, 16, 17)] == [3, 4, 18, 18]
    assert levels.delay(3) == timedelta(seconds=10)
    assert levels.delay(18) == timedelta(hours=2)
    assert levels.level_of_delay(timedelta(seconds=7)) == 3
    assert levels.level_of_delay(timedelta(days=1)) == 18


@pytest.mark.parametrize("level", [0, 19, -1, True, "3", 2.0])
def test_level_out_of_range_names_the_range(level: object) -> None:
    with pytest.raises(DelayLevelOutOfRange, match=r"levels are 1\.\.18"):
        parse_levels(DEFAULT_DELAY_LEVELS).check(level)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "1 to 64"),
        ("1s nope", r"level 2 \('nope'\)"),
        ("1s 0s", "level 2 .* positive"),
        ("1s " * 65, "65"),
    ],
)
def test_bad_level_lists(text: str, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        parse_levels(text)
    with pytest.raises(InvalidArgument):
        ConsumerConfig(retry_delay_levels=text)


def test_config_bounds() -> None:
    with pytest.raises(InvalidArgument, match="max_reconsume_times"):
        ConsumerConfig(max_reconsume_times=0)
    assert ConsumerConfig(retry=True, retry_delay_levels="1s 2s", max_reconsume_times=3).retry


def test_names() -> None:
    assert retry_topic("g") == "RETRY.g"
    assert dlq_topic("g") == "DLQ.g"
    assert dlq_group("DLQ.g") == "g"
    for bad in ("orders", "RETRY.g", "DLQ."):
        with pytest.raises(NotADlqTopic, match="not a dead-letter topic"):
            dlq_group(bad)
    check_retry_names("g" * 243)
    with pytest.raises(InvalidArgument, match="limit is 249"):
        check_retry_names("g" * 244)


def test_retry_info() -> None:
    assert retry_info(None) is None
    assert retry_info({"x": b"1"}) is None
    info = retry_info({H_TOPIC: b"t", H_PARTITION: b"2", H_OFFSET: b"9", H_COUNT: b"bad"})
    assert info is not None
    assert (info.topic, info.partition, info.offset, info.count) == ("t", 2, 9, 0)


def test_subscription_redrive_names() -> None:
    assert sub_dlq_topic("orders", "s") == push_dlq_topic("orders", "s") == "orders.s.DLQ"
    assert redrive_topic("orders", "s") == "orders.s.REDRIVE"
    # The subscription of its redrive topic dead-letters to the DLQ it was redriven from.
    assert sub_dlq_topic("orders.s.REDRIVE", "s") == "orders.s.DLQ"
    assert sub_dlq_topic("orders.s.REDRIVE", "t") == "orders.s.REDRIVE.t.DLQ"
    assert sub_dlq_topic(".s.REDRIVE", "s") == ".s.REDRIVE.s.DLQ"
    # Cursor groups: a group named like a topic and subscription does not share one.
    assert cursor_of("DLQ.orders.s") == "redrive.orders.s"
    assert cursor_of("orders.s.DLQ") == "redrive-sub.orders.s"
