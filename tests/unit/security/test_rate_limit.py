"""The failed-login limiter: a burst of failures refuses further attempts until the bucket refills; the
address and the user name are limited apart; memory stays bounded."""

from __future__ import annotations

import pytest

from sluice.errors import InvalidArgument, Throttled
from sluice.security.rate_limit import FailureLimiter, LimiterSettings, client_host


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(per_address: int = 5, per_user: int = 3, max_entries: int = 100) -> tuple[FailureLimiter, Clock]:
    clock = Clock()
    return FailureLimiter(LimiterSettings(per_address, per_user, 60.0, max_entries), clock), clock


def test_a_burst_of_failures_for_one_user_throttles_that_user_only() -> None:
    lim, _ = limiter()
    for _ in range(3):
        lim.check("10.0.0.1", "alice")
        lim.failed("10.0.0.1", "alice")
    with pytest.raises(Throttled) as info:
        lim.check("10.0.0.9", "alice")  # from any address
    assert "retry in" in info.value.message
    lim.check("10.0.0.1", "bob")  # the address still has failures left


def test_a_burst_from_one_address_throttles_every_user_from_it() -> None:
    lim, _ = limiter()
    for i in range(5):
        lim.failed("10.0.0.1", f"user{i}")
    with pytest.raises(Throttled):
        lim.check("10.0.0.1", "carol")
    with pytest.raises(Throttled):
        lim.check("10.0.0.1")
    lim.check("10.0.0.2", "carol")


def test_buckets_refill_over_the_window() -> None:
    lim, clock = limiter()
    for _ in range(3):
        lim.failed("10.0.0.1", "alice")
    with pytest.raises(Throttled):
        lim.check("10.0.0.1", "alice")
    clock.now += 60 / 3 + 0.01  # one failure's worth
    lim.check("10.0.0.1", "alice")
    lim.failed("10.0.0.1", "alice")
    with pytest.raises(Throttled):
        lim.check("10.0.0.1", "alice")


def test_throttled_message_does_not_say_which_limit() -> None:
    lim, _ = limiter()
    for _ in range(3):
        lim.failed("10.0.0.1", "alice")
    for i in range(5):
        lim.failed("10.0.0.2", f"u{i}")
    messages = set()
    for address, user in (("10.0.0.3", "alice"), ("10.0.0.2", "zed")):
        with pytest.raises(Throttled) as info:
            lim.check(address, user)
        messages.add(info.value.message.split(";")[0])
    assert len(messages) == 1


def test_memory_is_bounded() -> None:
    lim, _ = limiter(max_entries=50)
    for i in range(1000):
        lim.failed(f"10.0.{i // 256}.{i % 256}", f"user{i}")
    assert lim.tracked() == (50, 50)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        LimiterSettings(per_address=0)
    with pytest.raises(InvalidArgument):
        LimiterSettings(window_s=0)


@pytest.mark.parametrize(
    ("peer", "host"),
    [("ipv4:10.0.0.5:51234", "10.0.0.5"), ("ipv6:[::1]:51234", "::1"), ("unix:/tmp/s", "unix:/tmp/s")],
)
def test_client_host(peer: str, host: str) -> None:
    assert client_host(peer) == host


def test_attempts_in_flight_count_until_they_succeed() -> None:
    lim, _ = limiter(per_address=100, per_user=3)
    for _ in range(3):
        lim.begin("10.0.0.1", "alice")  # three concurrent exchanges, none finished yet
    with pytest.raises(Throttled):
        lim.begin("10.0.0.1", "alice")
    lim.succeeded("10.0.0.1", "alice")
    lim.begin("10.0.0.1", "alice")  # one came back


def test_successful_logins_cost_nothing() -> None:
    lim, _ = limiter(per_address=3, per_user=3)
    for _ in range(50):
        lim.begin("10.0.0.1", "alice")
        lim.succeeded("10.0.0.1", "alice")
    lim.check("10.0.0.1", "alice")
