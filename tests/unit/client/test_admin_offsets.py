"""Client-side validation: topic settings, offset specs, bootstrap addresses."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from sluice.client.admin import topic_config_to_proto
from sluice.client.client import Client
from sluice.client.consumer.offset_reset import ResetTo
from sluice.client.offsets import spec_to_timestamp
from sluice.errors import InvalidArgument


def test_topic_config_conversion() -> None:
    c = topic_config_to_proto(
        {
            "retention_ms": "7d",
            "segment_ms": timedelta(hours=1),
            "retention_bytes": "1GiB",
            "max_batch_bytes": 1024,
        }
    )
    assert c.retention_ms == 7 * 86_400_000
    assert c.segment_ms == 3_600_000
    assert c.retention_bytes == 1024**3
    assert c.max_batch_bytes == 1024
    assert topic_config_to_proto(None) == type(c)()


@pytest.mark.parametrize(
    "config",
    [
        {"retention": 5},
        {"retention_ms": -1},
        {"retention_ms": True},
        {"segment_bytes": 1.5},
        {"retention_ms": [1]},
    ],
)
def test_topic_config_rejects_bad_settings(config: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        topic_config_to_proto(config)


def test_offset_specs() -> None:
    assert spec_to_timestamp("earliest") == -2
    assert spec_to_timestamp("latest") == -1
    assert spec_to_timestamp(1_700_000_000_000) == 1_700_000_000_000
    for bad in ("first", -5, True, 1.5):
        with pytest.raises(InvalidArgument):
            spec_to_timestamp(bad)  # type: ignore[arg-type]


def test_bootstrap_from_env_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_BOOTSTRAP", "10.0.0.1:7700")
    with Client() as c:
        assert c.bootstrap == "10.0.0.1:7700"
    monkeypatch.delenv("SLUICE_BOOTSTRAP")
    with Client() as c:
        assert c.bootstrap == "127.0.0.1:7600"
        assert c.client_id.startswith("sluice-python-")
    for bad in ("localhost", "host:port", ":7600", "h:70000"):
        with pytest.raises(InvalidArgument, match="host:port"):
            Client(bad)
    with pytest.raises(InvalidArgument, match="request_timeout"):
        Client("h:1", request_timeout=0)


def test_closed_client_refuses_work() -> None:
    c = Client("127.0.0.1:1")
    c.close()
    c.close()
    with pytest.raises(Exception, match="closed"):
        c.metadata()


def test_reset_targets_are_checked_before_any_request() -> None:
    assert ResetTo.earliest() == ResetTo("earliest")
    assert ResetTo.offset(5) == ResetTo("offset", 5)
    assert ResetTo.shift(-3) == ResetTo("shift", -3)
    assert ResetTo.datetime(datetime(2026, 11, 25, 9, 30, tzinfo=UTC)) == ResetTo(
        "timestamp", 1_795_599_000_000
    )
    back = ResetTo.duration("15m")
    assert back.kind == "timestamp"
    assert abs(back.value - (time.time() * 1000 - 900_000)) < 60_000
    bad_targets: tuple[Callable[[], ResetTo], ...] = (
        lambda: ResetTo.offset(-1),
        lambda: ResetTo.offset(True),
        lambda: ResetTo.shift(1.5),  # type: ignore[arg-type]
        lambda: ResetTo.datetime(-1),
        lambda: ResetTo.duration("0s"),
        lambda: ResetTo.duration("soon"),
        lambda: ResetTo.duration(True),
    )
    for bad in bad_targets:
        with pytest.raises(InvalidArgument):
            bad()
