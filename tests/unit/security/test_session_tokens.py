"""Session tokens: minted claims come back, anything else is None (never an exception), any bit flip and
any expiry is refused, keys derived from one cluster token agree."""

from __future__ import annotations

import time
import timeit
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.errors import InvalidArgument
from sluice.security.session_tokens import PREFIX, SessionTokens, is_session_token

TOKENS = SessionTokens.from_cluster_token(b"cluster-secret-of-this-test")


def test_round_trip_carries_the_claims() -> None:
    token = TOKENS.mint("alice", "scram", 7, 60)
    assert is_session_token(token)
    assert token.startswith(PREFIX)
    claims = TOKENS.verify(token)
    assert claims is not None
    assert (claims.principal, claims.mechanism, claims.generation) == ("alice", "scram", 7)
    assert time.time() + 55 < claims.expires_at <= time.time() + 60


def test_every_service_derives_the_same_key_from_the_cluster_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_bytes(b"cluster-secret-of-this-test\n")  # a mounted Secret's trailing newline does not matter
    other = SessionTokens.from_cluster_token_file(path)
    assert other.verify(TOKENS.mint("bob", "scram", 1, 60)) is not None
    stranger = SessionTokens.from_cluster_token(b"another-cluster")
    assert stranger.verify(TOKENS.mint("bob", "scram", 1, 60)) is None
    assert SessionTokens.random().verify(TOKENS.mint("bob", "scram", 1, 60)) is None


def test_a_token_of_an_older_generation_or_a_deleted_user_is_refused() -> None:
    token = TOKENS.mint("alice", "scram", 3, 60)
    assert TOKENS.verify_current(token, {"alice": 3}) is not None
    assert TOKENS.verify_current(token, {"alice": 4}) is None  # the password changed
    assert TOKENS.verify_current(token, {"bob": 3}) is None  # deleted
    assert TOKENS.verify_current("garbage", {"alice": 3}) is None


def test_an_expired_token_is_refused() -> None:
    token = TOKENS.mint("alice", "scram", 1, 0.05)
    assert TOKENS.verify(token) is not None
    time.sleep(0.1)
    assert TOKENS.verify(token) is None


def test_a_jwt_is_not_a_session_token() -> None:
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"
    assert not is_session_token(jwt)
    assert TOKENS.verify(jwt) is None


@pytest.mark.parametrize(
    ("principal", "mechanism", "generation", "ttl"),
    [
        ("", "scram", 1, 60),
        ("a" * 513, "scram", 1, 60),
        ("a", "m" * 256, 1, 60),
        ("a", "scram", -1, 60),
        ("a", "scram", 1, 0),
    ],
)
def test_mint_refuses_bad_claims(principal: str, mechanism: str, generation: int, ttl: float) -> None:
    with pytest.raises(InvalidArgument):
        TOKENS.mint(principal, mechanism, generation, ttl)


def test_short_keys_and_empty_secrets_are_refused() -> None:
    with pytest.raises(InvalidArgument):
        SessionTokens(b"short")
    with pytest.raises(InvalidArgument):
        SessionTokens.from_cluster_token(b"")


@given(st.text(max_size=300))
def test_any_string_verifies_or_is_none(text: str) -> None:
    assert TOKENS.verify(text) is None
    assert TOKENS.verify(PREFIX + text) is None


@given(
    st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode()) <= 512),
    st.integers(0, 2**63 - 1),
    st.data(),
)
def test_any_bit_flip_is_refused(principal: str, generation: int, data: st.DataObject) -> None:
    token = TOKENS.mint(principal, "scram", generation, 300)
    claims = TOKENS.verify(token)
    assert claims is not None
    assert (claims.principal, claims.generation) == (principal, generation)
    index = data.draw(st.integers(0, len(token) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = token[:index] + chr(ord(token[index]) ^ (1 << bit)) + token[index + 1 :]
    assert TOKENS.verify(flipped) is None


def test_verification_costs_microseconds() -> None:
    token = TOKENS.mint("system:serviceaccount:spark:executor", "scram", 3, 300)
    runs = 2000
    per_call = min(timeit.repeat(lambda: TOKENS.verify(token), number=runs, repeat=3)) / runs
    # Typically ~3 us on the dev host; the bound leaves room for a loaded shared CI machine.
    assert per_call < 100e-6, per_call
