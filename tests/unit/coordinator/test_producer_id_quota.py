"""The per-client ration of new producer ids (KIP-936): a token bucket, bounded in clients."""

from __future__ import annotations

import pytest

from sluice.coordinator.producer_ids import ProducerIdQuota
from sluice.errors import Throttled


def test_a_burst_up_to_the_rate_passes_then_one_token_per_interval() -> None:
    quota = ProducerIdQuota(per_minute=60)
    for _ in range(60):
        quota.admit("job", now_ms=0)
    with pytest.raises(Throttled, match="retry in 1001 ms"):
        quota.admit("job", now_ms=0)
    quota.admit("job", now_ms=1_000)  # one token a second at 60 a minute
    with pytest.raises(Throttled):
        quota.admit("job", now_ms=1_500)
    quota.admit("other", now_ms=1_500)


def test_forgotten_clients_start_full_and_the_table_stays_bounded() -> None:
    quota = ProducerIdQuota(per_minute=1, max_clients=2)
    quota.admit("a", now_ms=0)
    quota.admit("b", now_ms=0)
    quota.admit("c", now_ms=0)  # "a" is forgotten
    quota.admit("a", now_ms=0)
    with pytest.raises(Throttled):
        quota.admit("c", now_ms=0)
