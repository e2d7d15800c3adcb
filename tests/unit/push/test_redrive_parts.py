"""The pure parts of a push consumer reading its redrive topic (docs/retry.md, "Redrive of push
subscriptions"): which topic it reads, the tenth of the queue its streams get, the settings."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.client.push import PushConsumerConfig, redrive_topic
from sluice.client.push.flow import FlowControl
from sluice.client.push.sessions import redrive_source
from sluice.common.names import MAX_NAME_LENGTH
from sluice.errors import InvalidArgument

NAMES = st.text("abcXYZ019._-", min_size=1, max_size=120)


def test_the_redrive_streams_share_a_tenth_of_the_queue() -> None:
    f = FlowControl(1000, ["a", "b", "r"])
    f.set_streams(["a", "b", "r"], minor=["r"])
    assert {k: s.share for k, s in f.streams.items()} == {"a": 450, "b": 450, "r": 100}
    assert [g for k in "abr" for g in f.on_subscribed(k)] == [("a", 450), ("b", 450), ("r", 100)]
    assert f.outstanding == 1000, "the consumer still holds at most receiver_queue_size"


def test_a_small_queue_still_gives_the_redrive_stream_one_permit() -> None:
    f = FlowControl(5, [])
    f.set_streams(["a", "r"], minor={"r"})
    assert {k: s.share for k, s in f.streams.items()} == {"a": 5, "r": 1}


@given(NAMES, NAMES)
def test_a_consumer_reads_its_redrive_topic_and_never_a_redrive_of_one(topic: str, sub: str) -> None:
    cfg = PushConsumerConfig()
    name = redrive_source(topic, sub, cfg)
    assert name == redrive_topic(topic, sub)
    assert redrive_source(name, sub, cfg) is None, "the consumer of a redrive topic reads only it"


def test_no_redrive_when_off_non_durable_zero_queue_or_too_long() -> None:
    cfg = PushConsumerConfig()
    assert redrive_source("t", "s", cfg.replace(redrive=False)) is None
    assert redrive_source("t", "s", cfg.replace(durable=False)) is None
    assert redrive_source("t", "s", cfg.replace(receiver_queue_size=0)) is None
    assert redrive_source("t" * (MAX_NAME_LENGTH - 10), "s", cfg) is not None  # 249 characters
    assert redrive_source("t" * (MAX_NAME_LENGTH - 9), "s", cfg) is None
    assert redrive_source("t", "s", cfg) == "t.s.REDRIVE"


def test_redrive_settings_are_checked() -> None:
    cfg = PushConsumerConfig().replace(redrive_check_interval="500ms")
    assert cfg.redrive_check_interval.total_seconds() == 0.5
    for bad in ({"redrive": "yes"}, {"redrive_check_interval": -1}):
        with pytest.raises(InvalidArgument, match="redrive"):
            PushConsumerConfig().replace(**bad)
