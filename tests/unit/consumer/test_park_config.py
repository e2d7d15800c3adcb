"""ConsumerConfig's parking settings (docs/poison-keys.md, "Pull consumers"): bad values are refused."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sluice.client.consumer import ConsumerConfig
from sluice.errors import InvalidArgument


def test_defaults_and_a_valid_setting() -> None:
    cfg = ConsumerConfig()
    assert (cfg.park_poison_keys, cfg.max_redeliver, cfg.parked_policy) == (False, 3, "dlq")
    cfg = ConsumerConfig.from_dict(
        {
            "park_poison_keys": "true",
            "max_redeliver": "0",
            "parked_policy": "hold",
            "park_retry_delay": "250ms",
        }
    )
    assert (cfg.max_redeliver, cfg.parked_policy, cfg.park_retry_delay) == (
        0,
        "hold",
        timedelta(milliseconds=250),
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_redeliver": -1}, "max_redeliver must be between 0 and 1000"),
        ({"max_redeliver": 1001}, "max_redeliver must be between 0 and 1000"),
        ({"parked_policy": "drop"}, "parked_policy must be dlq or hold"),
        ({"park_retry_delay": timedelta(seconds=-1)}, "park_retry_delay must not be negative"),
        ({"park_poison_keys": True, "commit_mode": "in-flight-min"}, 'needs commit_mode="poll"'),
    ],
)
def test_bad_settings_name_the_setting(settings: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ConsumerConfig().replace(**settings)
