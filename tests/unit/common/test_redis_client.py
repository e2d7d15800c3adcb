"""Redis addresses: a plain server or Sentinels naming a primary, parsed or refused with a clear error."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.common.redis_client import SentinelAddress, parse_sentinel_url, validate_url
from sluice.errors import InvalidArgument


def test_a_sentinel_address_names_its_sentinels_service_db_and_password() -> None:
    url = "redis+sentinel://:s%40cret@a:26379,b.example:26380/orders/3"
    sentinels = (("a", 26379), ("b.example", 26380))
    assert parse_sentinel_url(url) == SentinelAddress(sentinels, "orders", 3, "s@cret")
    assert parse_sentinel_url("redis+sentinel://127.0.0.1:26379/sluice") == SentinelAddress(
        (("127.0.0.1", 26379),), "sluice", 0, None
    )


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://a/sluice", "expected host:port"),
        ("redis+sentinel://a:0/sluice", "expected host:port"),
        ("redis+sentinel://a:26379", "expected /service_name"),
        ("redis+sentinel://a:26379/s/x", "must be a number"),
        ("redis+sentinel://a:26379/s/0/extra", "expected /service_name"),
        ("http://a:6379/0", "expected redis://"),
        ("a:6379", "expected redis://"),
    ],
)
def test_malformed_addresses_are_refused_naming_the_problem(url: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        validate_url(url)


@pytest.mark.parametrize("url", ["redis://h:6379/0", "rediss://h:6380/1", "unix:///tmp/r.sock?db=2"])
def test_plain_addresses_pass(url: str) -> None:
    validate_url(url)


@given(st.text(max_size=80))
def test_no_text_crashes_the_parser(url: str) -> None:
    with contextlib.suppress(InvalidArgument):
        validate_url(url)


def test_a_sentinel_address_carries_an_acl_user_and_whether_the_sentinels_take_it() -> None:
    url = "redis+sentinel://sluice:s%3Acret@a:26379,b:26379/orders/1?sentinel_auth=yes"
    assert parse_sentinel_url(url) == SentinelAddress(
        (("a", 26379), ("b", 26379)), "orders", 1, "s:cret", "sluice", True
    )
    # Without the option the Sentinels are asked anonymously, as before ACL users.
    plain = parse_sentinel_url("redis+sentinel://sluice:pw@a:26379/orders")
    assert (plain.username, plain.password, plain.sentinel_auth) == ("sluice", "pw", False)
    assert parse_sentinel_url("redis+sentinel://:pw@a:26379/orders?sentinel_auth=no").sentinel_auth is False


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://a:26379/s?sentinel_auth=yes", "needs a password"),
        ("redis+sentinel://:pw@a:26379/s?sentinel_auth=maybe", "must be yes or no"),
        ("redis+sentinel://:pw@a:26379/s?sentinel_password=x", "unknown option 'sentinel_password'"),
    ],
)
def test_sentinel_options_are_checked(url: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        validate_url(url)
