"""The server-side authentication chain with the real mechanisms (cluster token, session tokens,
JWT): who each credential makes the caller, what is refused, and what a session's generation does."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sluice.errors import AuthenticationError, CredentialsExpired, Throttled
from sluice.security.authenticate import CLUSTER_PRINCIPAL, ServerAuthenticator
from sluice.security.jwt_auth import JwtVerifier
from sluice.security.rate_limit import FailureLimiter, LimiterSettings
from sluice.security.session_tokens import SessionTokens
from sluice.security.settings import SecuritySettings
from tests.jwt_tokens import AUDIENCE, ISSUER, claims, public_pem, rsa_key, sign

CLUSTER_TOKEN = b"the-cluster-token-of-this-test"
SESSIONS = SessionTokens.from_cluster_token(CLUSTER_TOKEN)


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def chain(generations: dict[str, int] | None = None, **kw: object) -> ServerAuthenticator:
    gens = generations if generations is not None else {}
    return ServerAuthenticator(
        mechanisms=frozenset({"scram"}),
        cluster_token=CLUSTER_TOKEN,
        sessions=SESSIONS,
        user_generations=lambda: gens,
        **kw,  # type: ignore[arg-type]
    )


def test_the_cluster_token_makes_the_caller_the_cluster() -> None:
    who = chain().authenticate_now(bearer(CLUSTER_TOKEN.decode()), None)
    assert who is not None
    assert who.principal == CLUSTER_PRINCIPAL
    assert who.principal.cluster
    assert who.expires_at is None


def test_a_session_token_names_its_user_until_the_user_changes() -> None:
    gens = {"alice": 3}
    auth = chain(gens)
    token = SESSIONS.mint("alice", "scram", 3, 60)
    who = auth.authenticate_now(bearer(token), None)
    assert who is not None
    assert who.principal.name == "alice"
    assert who.principal.mechanism == "scram"
    assert who.expires_at is not None
    assert who.credentials is not None
    assert who.credentials() is None
    gens["alice"] = 4  # the password changed (or the user was deleted: its generation moved on too)
    assert isinstance(who.credentials(), CredentialsExpired)
    auth.forget_sessions()
    with pytest.raises(CredentialsExpired):
        auth.authenticate_now(bearer(token), None)


def test_a_user_this_service_has_not_heard_of_yet_is_given_the_benefit() -> None:
    """The snapshot lags a new user by a moment; its first session must not be refused meanwhile."""
    who = chain({}).authenticate_now(bearer(SESSIONS.mint("newcomer", "scram", 1, 60)), None)
    assert who is not None
    assert who.principal.name == "newcomer"


def test_forged_expired_or_foreign_session_tokens_are_refused() -> None:
    auth = chain()
    stranger = SessionTokens.from_cluster_token(b"another-cluster-entirely")
    expired = SESSIONS.mint("alice", "scram", 1, 0.001)
    time.sleep(0.01)
    for token in (
        expired,
        stranger.mint("alice", "scram", 1, 60),
        "sls1.garbage.more",
        "not-a-token",
    ):
        with pytest.raises(AuthenticationError):
            auth.authenticate_now(bearer(token), None)


def test_no_credentials_or_a_malformed_header_are_refused_when_authentication_is_on() -> None:
    auth = chain()
    with pytest.raises(AuthenticationError, match="requires authentication"):
        auth.authenticate_now({}, None)
    with pytest.raises(AuthenticationError, match="Bearer"):
        auth.authenticate_now({"authorization": "Basic YWRtaW46YWRtaW4="}, None)
    anonymous = chain(allow_anonymous=True).authenticate_now({}, None)
    assert anonymous is not None
    assert anonymous.principal.anonymous


def test_without_mechanisms_everyone_is_anonymous_and_the_cluster_is_still_the_cluster() -> None:
    auth = ServerAuthenticator(cluster_token=CLUSTER_TOKEN)
    assert auth.enabled
    assert not auth.required
    who = auth.authenticate_now({}, None)
    assert who is not None
    assert who.principal.anonymous
    cluster = auth.authenticate_now(bearer(CLUSTER_TOKEN.decode()), None)
    assert cluster is not None
    assert cluster.principal.cluster


def test_a_client_certificate_is_the_principal_with_mtls() -> None:
    auth = ServerAuthenticator(mechanisms=frozenset({"mtls"}))
    who = auth.authenticate_now({}, "CN=spark-job,O=analytics")
    assert who is not None
    assert who.principal.name == "CN=spark-job,O=analytics"
    assert who.principal.mechanism == "mtls"
    with pytest.raises(AuthenticationError):
        auth.authenticate_now({}, None)


def test_a_jwt_is_verified_once_then_answered_from_the_cache(tmp_path: Path) -> None:
    key = rsa_key()
    pem = tmp_path / "jwt.pem"
    pem.write_bytes(public_pem(key))
    settings = SecuritySettings(
        auth_mechanisms="jwt", jwt_public_key_file=pem, jwt_issuer=ISSUER, jwt_audience=AUDIENCE
    )
    auth = ServerAuthenticator(mechanisms=frozenset({"jwt"}), jwt=JwtVerifier.from_settings(settings))
    token = sign(claims(), key)
    assert auth.authenticate_now(bearer(token), None) is None  # not seen yet: needs the verifier
    who = asyncio.run(auth.authenticate(bearer(token), None))
    assert who.principal.name == "system:serviceaccount:spark:executor"
    assert who.principal.mechanism == "jwt"
    assert who.expires_at is not None
    again = auth.authenticate_now(bearer(token), None)
    assert again == who
    with pytest.raises(AuthenticationError):
        asyncio.run(auth.authenticate(bearer(sign(claims(aud=["someone-else"]), key)), None))


def test_a_host_sending_bad_tokens_is_throttled_before_any_verification() -> None:
    limiter = FailureLimiter(LimiterSettings(per_address=3, per_user=3, window_s=60))
    auth = chain(limiter=limiter)
    good = SESSIONS.mint("alice", "scram", 1, 60)
    assert auth.authenticate_now(bearer(good), None, "10.0.0.1") is not None  # now cached
    stranger = SessionTokens.from_cluster_token(b"another-cluster-entirely")
    for _ in range(3):
        with pytest.raises(AuthenticationError):
            auth.authenticate_now(bearer(stranger.mint("alice", "scram", 1, 60)), None, "10.0.0.1")
    with pytest.raises(Throttled):
        auth.authenticate_now(bearer(SESSIONS.mint("bob", "scram", 1, 60)), None, "10.0.0.1")
    assert auth.authenticate_now(bearer(good), None, "10.0.0.1") is not None  # a known token: no check
    assert auth.authenticate_now(bearer(SESSIONS.mint("bob", "scram", 1, 60)), None, "10.0.0.2") is not None
