"""JwtVerifier with a static key (--jwt-public-key-file): the claim rules, the algorithm rules, the
configuration rules and the verified-token cache. The JWKS cases are in
tests/integration/security/test_jwks_http.py (a real HTTP server)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.errors import AuthenticationError, InvalidArgument
from sluice.security.jwt_auth import LEEWAY_SECONDS, MAX_TOKEN_CHARS, JwtVerifier, VerifiedToken
from sluice.security.model import Principal
from sluice.security.settings import SecuritySettings
from tests.jwt_tokens import (
    AUDIENCE,
    ISSUER,
    b64,
    b64json,
    claims,
    ec_key,
    hmac_signed,
    public_pem,
    rsa_key,
    sign,
    tampered,
    unsigned,
)

SECRET = b"0123456789abcdef0123456789abcdef-hs-secret"


def _settings(tmp_path: Path, key: bytes | None = None, **overrides: object) -> SecuritySettings:
    path = tmp_path / "jwt.pem"
    path.write_bytes(public_pem(rsa_key()) if key is None else key)
    base = SecuritySettings(
        auth_mechanisms="jwt", jwt_public_key_file=path, jwt_issuer=ISSUER, jwt_audience=AUDIENCE
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def _verifier(tmp_path: Path, key: bytes | None = None, **overrides: object) -> JwtVerifier:
    return JwtVerifier.from_settings(_settings(tmp_path, key, **overrides))


def _verify(verifier: JwtVerifier, token: str) -> VerifiedToken:
    return asyncio.run(verifier.verify(token))


def _refused(verifier: JwtVerifier, token: str, words: str) -> str:
    with pytest.raises(AuthenticationError, match=words) as info:
        _verify(verifier, token)
    message = str(info.value)
    assert token not in message
    return message


def test_a_kubernetes_serviceaccount_token_names_its_serviceaccount(tmp_path: Path) -> None:
    verified = _verify(_verifier(tmp_path), sign(claims(), rsa_key()))
    assert verified.principal == "system:serviceaccount:spark:executor"
    assert verified.to_principal() == Principal(name="system:serviceaccount:spark:executor", mechanism="jwt")
    assert verified.issuer == ISSUER
    assert verified.key_id == "k1"
    assert verified.token_id == "5f1c0d2e-jti"
    assert verified.kubernetes is not None
    assert (verified.kubernetes.namespace, verified.kubernetes.serviceaccount, verified.kubernetes.pod) == (
        "spark",
        "executor",
        "job-exec-1",
    )
    assert abs(verified.expires_at - (time.time() + 3600)) < 60


def test_an_ec_key_verifies_es256(tmp_path: Path) -> None:
    verifier = _verifier(tmp_path, public_pem(ec_key()), jwt_algorithms="ES256")
    assert _verify(verifier, sign(claims(), ec_key())).principal.startswith("system:serviceaccount:")


@pytest.mark.parametrize("alg", ["none", "None", "NONE", "nOnE"])
def test_alg_none_is_refused(tmp_path: Path, alg: str) -> None:
    _refused(_verifier(tmp_path), unsigned(claims(), alg=alg), "algorithm .* is not accepted")


def test_hs256_signed_with_the_rsa_public_key_is_refused(tmp_path: Path) -> None:
    """The algorithm-confusion forgery: the attacker knows the public key and uses it as HMAC secret."""
    forged = hmac_signed(claims(sub="admin"), public_pem(rsa_key()))
    _refused(_verifier(tmp_path), forged, "algorithm 'HS256' is not accepted")


def test_a_token_of_an_accepted_algorithm_the_key_does_not_fit_is_refused(tmp_path: Path) -> None:
    # RS256 and ES256 accepted, the key is RSA: an ES256 token finds no key (not a verification with it).
    verifier = _verifier(tmp_path, jwt_algorithms="RS256,ES256")
    _refused(verifier, sign(claims(), ec_key()), "no key with kid 'k1' for ES256")


def test_an_expired_token_is_refused(tmp_path: Path) -> None:
    now = int(time.time())
    token = sign(claims(iat=now - 7200, nbf=now - 7200, exp=now - LEEWAY_SECONDS - 5), rsa_key())
    _refused(_verifier(tmp_path), token, "expired")


def test_a_token_expired_within_the_leeway_is_accepted(tmp_path: Path) -> None:
    now = int(time.time())
    token = sign(claims(iat=now - 7200, nbf=now - 7200, exp=now - LEEWAY_SECONDS // 2), rsa_key())
    assert _verify(_verifier(tmp_path), token).expires_at == now - LEEWAY_SECONDS // 2


def test_a_token_without_exp_is_refused(tmp_path: Path) -> None:
    _refused(_verifier(tmp_path), sign(claims(exp=None), rsa_key()), "no exp claim")


def test_a_token_not_valid_yet_is_refused(tmp_path: Path) -> None:
    token = sign(claims(nbf=int(time.time()) + 600), rsa_key())
    _refused(_verifier(tmp_path), token, "not valid yet")


def test_a_wrong_audience_is_refused(tmp_path: Path) -> None:
    _refused(_verifier(tmp_path), sign(claims(aud=["vault"]), rsa_key()), "audience")


def test_a_missing_audience_is_refused_when_one_is_configured(tmp_path: Path) -> None:
    _refused(_verifier(tmp_path), sign(claims(aud=None), rsa_key()), "no aud claim")


def test_a_wrong_issuer_is_refused(tmp_path: Path) -> None:
    _refused(_verifier(tmp_path), sign(claims(iss="https://evil.example"), rsa_key()), "issuer")


def test_no_issuer_configured_accepts_any_issuer(tmp_path: Path) -> None:
    verifier = _verifier(tmp_path, jwt_issuer="")
    assert (
        _verify(verifier, sign(claims(iss="https://idp.example"), rsa_key())).issuer == "https://idp.example"
    )


def test_a_tampered_payload_is_refused(tmp_path: Path) -> None:
    token = tampered(sign(claims(), rsa_key()), sub="system:serviceaccount:kube-system:admin")
    _refused(_verifier(tmp_path), token, "signature does not verify")


def test_a_token_signed_by_another_key_is_refused(tmp_path: Path) -> None:
    _refused(_verifier(tmp_path), sign(claims(), rsa_key("other")), "signature does not verify")


def test_a_configured_principal_claim_other_than_sub_names_the_principal(tmp_path: Path) -> None:
    verifier = _verifier(tmp_path, jwt_principal_claim="preferred_username")
    token = sign(claims(sub="0c5f-uuid", preferred_username="alice"), rsa_key())
    verified = _verify(verifier, token)
    assert (verified.principal, verified.subject) == ("alice", "0c5f-uuid")


@pytest.mark.parametrize("value", [None, "", 7, ["alice"], {"name": "alice"}, "al\nice", "x" * 2000])
def test_the_principal_claim_must_be_a_printable_non_empty_string(tmp_path: Path, value: object) -> None:
    verifier = _verifier(tmp_path, jwt_principal_claim="email")
    token = sign(claims(email=value), rsa_key()) if value is not None else sign(claims(), rsa_key())
    _refused(verifier, token, "claim 'email' is not a")


def test_an_hs256_configuration_verifies_with_its_secret_only(tmp_path: Path) -> None:
    verifier = _verifier(tmp_path, SECRET, jwt_algorithms="HS256")
    assert _verify(verifier, hmac_signed(claims(), SECRET)).principal.endswith(":executor")
    _refused(verifier, hmac_signed(claims(), SECRET[:-1] + b"!"), "signature does not verify")
    _refused(verifier, sign(claims(), rsa_key()), "algorithm 'RS256' is not accepted")


def test_the_cache_answers_a_repeat_and_forgets_a_token_at_its_exp(tmp_path: Path) -> None:
    now = [time.time()]
    verifier = JwtVerifier.from_settings(_settings(tmp_path), clock=lambda: now[0])
    token = sign(claims(exp=int(now[0]) + 100), rsa_key())
    first = _verify(verifier, token)
    assert _verify(verifier, token) is first  # the cached object: no second verification
    now[0] = first.expires_at  # the cache's clock reaches exp: the entry is gone
    second = _verify(verifier, token)  # verified again (PyJWT's own clock still finds it valid)
    assert second is not first
    assert second == first


def test_a_token_accepted_within_the_leeway_is_not_cached(tmp_path: Path) -> None:
    verifier = _verifier(tmp_path)
    wall = int(time.time())
    token = sign(claims(iat=wall - 600, nbf=wall - 600, exp=wall - LEEWAY_SECONDS + 3), rsa_key())
    _verify(verifier, token)
    assert len(verifier._cache) == 0  # cached only until exp, which has passed


def test_the_cache_is_bounded(tmp_path: Path) -> None:
    verifier = JwtVerifier.from_settings(_settings(tmp_path), max_cached=8)
    for n in range(20):
        _verify(verifier, sign(claims(jti=f"t{n}"), rsa_key()))
    assert len(verifier._cache) == 8


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"jwt_algorithms": "HS256,RS256"}, "never mixed"),
        ({"jwt_algorithms": "RS256,none"}, "not accepted: none"),
        ({"jwt_algorithms": " , "}, "no algorithm"),
        ({"jwt_algorithms": "EdDSA"}, "not accepted: EdDSA"),
        ({"jwt_principal_claim": ""}, "jwt_principal_claim: empty"),
        ({"jwt_public_key_file": None}, "no key to verify tokens with"),
        ({"jwt_jwks_url": "http://idp.example/jwks"}, "plain http is allowed only to a loopback"),
        ({"jwt_jwks_url": "ftp://idp.example/jwks"}, "not an https:// URL"),
        ({"jwt_public_key_file": Path("/nonexistent/key.pem")}, "cannot read"),
    ],
)
def test_an_unsafe_or_broken_configuration_is_refused_at_start(
    tmp_path: Path, overrides: dict[str, object], words: str
) -> None:
    with pytest.raises(InvalidArgument, match=words):
        _verifier(tmp_path, None, **overrides)


def test_an_unreadable_jwks_ca_or_token_file_is_refused_at_start(tmp_path: Path) -> None:
    bad_ca = tmp_path / "ca.crt"
    bad_ca.write_text("not a certificate")
    url = "https://kubernetes.default.svc/openid/v1/jwks"
    with pytest.raises(InvalidArgument, match="jwt_jwks_ca_file: cannot load"):
        _verifier(tmp_path, None, jwt_jwks_url=url, jwt_jwks_ca_file=bad_ca)
    with pytest.raises(InvalidArgument, match="jwt_jwks_token_file: cannot read"):
        _verifier(tmp_path, None, jwt_jwks_url=url, jwt_jwks_token_file=tmp_path / "missing")


def test_an_hs_configuration_with_a_jwks_url_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="HS\\* algorithms use a secret"):
        _verifier(tmp_path, SECRET, jwt_algorithms="HS256", jwt_jwks_url="https://idp.example/jwks")


def test_an_hs_configuration_with_a_short_secret_or_a_pem_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="at least 32 are required"):
        _verifier(tmp_path, b"short", jwt_algorithms="HS256")
    with pytest.raises(InvalidArgument, match="holds a PEM key"):
        _verifier(tmp_path, public_pem(rsa_key()), jwt_algorithms="HS256")


def test_a_key_file_that_fits_no_configured_algorithm_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="fits none of jwt_algorithms"):
        _verifier(tmp_path, public_pem(ec_key()), jwt_algorithms="RS256")
    with pytest.raises(InvalidArgument, match="not a PEM public key"):
        _verifier(tmp_path, b"-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n")
    with pytest.raises(InvalidArgument, match="RSA key of 1024 bits"):
        _verifier(tmp_path, public_pem(rsa_key("small", 1024)))


@pytest.mark.parametrize(
    "token",
    [
        "",
        "a.b",
        "a.b.c",
        "...",
        "x" * (MAX_TOKEN_CHARS + 1),
        f"{b64json([1, 2])}.{b64json({})}.",
        f"{b64json({'alg': 'RS256', 'kid': 7})}.{b64json({})}.",
        f"{b64json({'alg': 'RS256'})}.{b64json([1])}.AAAA",
        f"{b64json({'alg': ['RS256']})}.{b64json({})}.",
        f"{b64json({'alg': 'RS256', 'x': [[[[[[[[[[]]]]]]]]]] * 1})}.e30.AAAA",
        "e30." * 3,
        f"{b64(b'[' * 3000 + b']' * 3000)}.e30.",
    ],
)
def test_malformed_tokens_are_refused(tmp_path: Path, token: str) -> None:
    with pytest.raises(AuthenticationError):
        _verify(_verifier(tmp_path), token)


_VERIFIER_CACHE: dict[str, JwtVerifier] = {}


def _fuzz_verifier(tmp_path_factory: pytest.TempPathFactory) -> JwtVerifier:
    if "v" not in _VERIFIER_CACHE:
        _VERIFIER_CACHE["v"] = _verifier(tmp_path_factory.mktemp("fuzz"))
    return _VERIFIER_CACHE["v"]


_HEADERS = st.dictionaries(
    st.sampled_from(["alg", "kid", "typ", "crit", "jku", "x5u"]),
    st.one_of(st.sampled_from(["RS256", "ES256", "none", "HS256", "k1"]), st.integers(), st.text(max_size=8)),
)
_SEGMENT = st.one_of(st.text(max_size=40), st.binary(max_size=40).map(lambda b: b64json(b.hex())))


@given(
    token=st.one_of(
        st.text(max_size=300),
        st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
        st.tuples(_HEADERS.map(b64json), _SEGMENT, _SEGMENT).map(".".join),
        st.tuples(_HEADERS.map(b64json), st.just(b64json(claims())), _SEGMENT).map(".".join),
    )
)
def test_arbitrary_tokens_raise_only_authentication_error(
    tmp_path_factory: pytest.TempPathFactory, token: str
) -> None:
    verifier = _fuzz_verifier(tmp_path_factory)
    with pytest.raises(AuthenticationError):
        _verify(verifier, token)
