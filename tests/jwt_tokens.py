"""Signing keys, JWKS documents and tokens for the JWT tests (tests/unit/security,
tests/integration/security): what an OIDC provider or the Kubernetes API server would issue."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey

ISSUER = "https://kubernetes.default.svc.cluster.local"
AUDIENCE = "sluice"


@functools.cache
def rsa_key(name: str = "a", bits: int = 2048) -> rsa.RSAPrivateKey:
    """One RSA key per name for the whole run (generating one takes ~0.1 s)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=bits)


@functools.cache
def ec_key(name: str = "a", curve: str = "P-256") -> ec.EllipticCurvePrivateKey:
    curves: dict[str, ec.EllipticCurve] = {"P-256": ec.SECP256R1(), "P-384": ec.SECP384R1()}
    return ec.generate_private_key(curves[curve])


def public_pem(key: PrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def jwk(key: PrivateKey, kid: str | None, **extra: Any) -> dict[str, Any]:
    """The public JWK of ``key`` as a JWKS publishes it."""
    if isinstance(key, rsa.RSAPrivateKey):
        entry = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
    else:
        entry = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
    if kid is not None:
        entry["kid"] = kid
    entry.update(extra)
    return entry


def jwks(*entries: dict[str, Any]) -> bytes:
    return json.dumps({"keys": list(entries)}).encode()


def claims(**overrides: Any) -> dict[str, Any]:
    """A Kubernetes ServiceAccount token's claims (namespace spark, ServiceAccount executor)."""
    now = int(time.time())
    base: dict[str, Any] = {
        "iss": ISSUER,
        "aud": [AUDIENCE],
        "sub": "system:serviceaccount:spark:executor",
        "iat": now,
        "nbf": now,
        "exp": now + 3600,
        "jti": "5f1c0d2e-jti",
        "kubernetes.io": {
            "namespace": "spark",
            "serviceaccount": {"name": "executor", "uid": "0b0e-sa"},
            "pod": {"name": "job-exec-1", "uid": "77aa-pod"},
            "node": {"name": "node-1", "uid": "99cc-node"},
        },
    }
    base.update(overrides)
    return {name: value for name, value in base.items() if value is not None}


def sign(payload: dict[str, Any], key: PrivateKey, kid: str | None = "k1", algorithm: str = "") -> str:
    algorithm = algorithm or ("RS256" if isinstance(key, rsa.RSAPrivateKey) else "ES256")
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode(payload, key, algorithm=algorithm, headers=headers)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64json(value: object) -> str:
    return b64(json.dumps(value).encode())


def unsigned(payload: dict[str, Any], alg: str = "none", kid: str | None = "k1") -> str:
    """An ``alg: none`` token (no signature), built by hand: PyJWT will not make one with a kid."""
    header: dict[str, Any] = {"alg": alg, "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    return f"{b64json(header)}.{b64json(payload)}."


def hmac_signed(payload: dict[str, Any], secret: bytes, kid: str | None = "k1", alg: str = "HS256") -> str:
    """An HS* token signed with any bytes as the secret, built by hand: PyJWT refuses a PEM public key
    as an HMAC secret, which is exactly the algorithm-confusion forgery the verifier must refuse."""
    header: dict[str, Any] = {"alg": alg, "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    signing_input = f"{b64json(header)}.{b64json(payload)}"
    digest = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}[alg]
    signature = hmac.new(secret, signing_input.encode(), digest).digest()
    return f"{signing_input}.{b64(signature)}"


def tampered(token: str, **changes: Any) -> str:
    """``token`` with its payload changed and the original signature kept."""
    header, payload, signature = token.split(".")
    claims_ = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims_.update(changes)
    return f"{header}.{b64json(claims_)}.{signature}"
