"""ConsumerConfig: conversions, validation and callbacks."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sluice.client.consumer.config import ConsumerConfig
from sluice.errors import InvalidArgument


def test_defaults_follow_the_contract() -> None:
    c = ConsumerConfig()
    assert c.auto_offset_reset == "latest"
    assert c.enable_auto_commit is True
    assert c.auto_commit_interval == timedelta(seconds=5)
    assert c.session_timeout == timedelta(seconds=45)
    assert c.commit_mode == "poll"
    assert c.message_model == "clustering"


def test_replace_converts_strings() -> None:
    c = ConsumerConfig().replace(
        auto_commit_interval="250ms",
        buffer_max_bytes="2MiB",
        enable_auto_commit="false",
        session_timeout=2,
    )
    assert c.auto_commit_interval == timedelta(milliseconds=250)
    assert c.buffer_max_bytes == 2 * 1024 * 1024
    assert c.enable_auto_commit is False
    assert c.session_timeout_ms == 2000


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("auto_offset_reset", "smallest", "auto_offset_reset"),
        ("commit_mode", "whenever", "commit_mode"),
        ("message_model", "fanout", "message_model"),
        ("session_timeout", "10ms", "session_timeout"),
        ("max_poll_records", 0, "max_poll_records"),
        ("buffer_max_bytes", 0, "buffer_max_bytes"),
        ("auto_commit_interval", "0s", "auto_commit_interval"),
        ("enable_auto_commit", "maybe", "enable_auto_commit"),
        ("max_poll_records", True, "max_poll_records"),
        ("on_assign", 5, "on_assign"),
        ("on_commit", "log it", "on_commit"),
        ("max_in_flight_commits", 0, "max_in_flight_commits"),
        ("max_in_flight_commits", 17, "max_in_flight_commits"),
        ("max_in_flight_commits", "many", "max_in_flight_commits"),
    ],
)
def test_bad_values_name_the_key(key: str, value: object, needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        ConsumerConfig().replace(**{key: value})


def test_unknown_keys_are_rejected() -> None:
    with pytest.raises(InvalidArgument, match=r"unknown consumer setting.*auto_ofset_reset"):
        ConsumerConfig().replace(auto_ofset_reset="earliest")


def test_from_env_reads_prefixed_variables_only() -> None:
    env = {"SLUICE_CONSUMER_AUTO_OFFSET_RESET": "earliest", "SLUICE_CONSUMER_MAX_POLL_RECORDS": "7", "X": "y"}
    c = ConsumerConfig.from_env(env)
    assert (c.auto_offset_reset, c.max_poll_records) == ("earliest", 7)


def test_callbacks_fall_back_to_the_listener_and_on_lost_to_on_revoke() -> None:
    seen: list[tuple[str, list[tuple[str, int]]]] = []

    class Listener:
        def on_assign(self, partitions: list[tuple[str, int]]) -> None:
            seen.append(("assign", partitions))

    def revoke(partitions: list[tuple[str, int]]) -> None:
        seen.append(("revoke", partitions))

    c = ConsumerConfig(listener=Listener(), on_revoke=revoke)
    assign = c.callback("on_assign")
    lost = c.callback("on_lost")
    assert assign is not None
    assert lost is not None
    assign([("t", 0)])
    lost([("t", 1)])
    assert seen == [("assign", [("t", 0)]), ("revoke", [("t", 1)])]
    assert ConsumerConfig().callback("on_lost") is None


def test_async_commit_settings_default_to_one_in_flight_and_no_callback() -> None:
    c = ConsumerConfig()
    assert (c.max_in_flight_commits, c.on_commit) == (1, None)
    assert ConsumerConfig().replace(max_in_flight_commits="4").max_in_flight_commits == 4


def test_on_commit_is_never_read_from_the_environment() -> None:
    c = ConsumerConfig.from_env(
        {"SLUICE_CONSUMER_ON_COMMIT": "print", "SLUICE_CONSUMER_MAX_IN_FLIGHT_COMMITS": "2"}
    )
    assert (c.on_commit, c.max_in_flight_commits) == (None, 2)
