"""Which keys may verify which algorithms, and which JWKS entries are used at all."""

from __future__ import annotations

import json
import logging

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from sluice.errors import InvalidArgument
from sluice.security.jwt_keys import jwk_from_dict, key_fits, parse_algorithms, parse_jwks
from tests.jwt_tokens import ec_key, jwk, jwks, rsa_key


def test_parse_algorithms_accepts_a_family() -> None:
    assert parse_algorithms(" RS256, ES256 ,PS384") == frozenset({"RS256", "ES256", "PS384"})
    assert parse_algorithms("HS256,HS512") == frozenset({"HS256", "HS512"})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("HS256,ES256", "never mixed"),
        ("none", "not accepted: none"),
        ("", "no algorithm"),
        ("rs256", "rs256"),
    ],
)
def test_parse_algorithms_refuses(text: str, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        parse_algorithms(text)


def test_a_key_fits_only_its_own_family_and_curve() -> None:
    rsa_public = rsa_key().public_key()
    p256 = ec_key().public_key()
    p384 = ec_key("b", "P-384").public_key()
    assert key_fits("RS256", rsa_public)
    assert key_fits("PS512", rsa_public)
    assert not key_fits("ES256", rsa_public)
    assert not key_fits("HS256", rsa_public)  # never an HMAC secret
    assert key_fits("ES256", p256)
    assert not key_fits("ES384", p256)
    assert key_fits("ES384", p384)
    assert not key_fits("RS256", p256)
    assert key_fits("HS256", b"secret")
    assert not key_fits("RS256", b"secret")


def test_jwks_entries_rsa_and_ec_are_used_others_skipped(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    document = jwks(
        jwk(rsa_key(), "r1"),
        jwk(ec_key(), "e1", alg="ES256"),
        jwk(rsa_key(), "enc", use="enc"),
        {"kty": "oct", "kid": "o1", "k": "c2VjcmV0"},
        {"kty": "RSA", "kid": "broken", "n": "AQAB"},
        jwk(rsa_key("small", 1024), "small"),
        jwk(rsa_key(), 7),  # type: ignore[arg-type]
        "not an object",  # type: ignore[arg-type]
    )
    keys = parse_jwks(document)
    assert set(keys) == {"r1", "e1"}
    assert isinstance(keys["r1"].key, rsa.RSAPublicKey)
    assert isinstance(keys["e1"].key, ec.EllipticCurvePublicKey)
    assert keys["e1"].fits("ES256")
    assert "1024 bits" in caplog.text


def test_a_jwk_with_an_alg_verifies_only_that_algorithm() -> None:
    entry = jwk_from_dict(jwk(rsa_key(), "r1", alg="RS512"))
    assert entry is not None
    assert entry.fits("RS512")
    assert not entry.fits("RS256")


def test_a_published_private_key_is_used_as_its_public_key() -> None:
    from jwt.algorithms import RSAAlgorithm

    private = RSAAlgorithm.to_jwk(rsa_key(), as_dict=True) | {"kid": "p"}
    entry = jwk_from_dict(private)
    assert entry is not None
    assert isinstance(entry.key, rsa.RSAPublicKey)


@pytest.mark.parametrize("raw", [b"[]", b'{"keys": {}}', b"not json", json.dumps({"k": []}).encode()])
def test_a_document_that_is_not_a_jwks_is_an_error(raw: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - json's and ours, both ValueError
        parse_jwks(raw)
