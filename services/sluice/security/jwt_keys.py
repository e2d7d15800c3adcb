"""The keys and algorithms a JWT may be verified with (docs/security.md, "JWT and Kubernetes
ServiceAccount tokens").

Which algorithm a token claims is attacker input, so everything here answers from the configuration:
the accepted algorithms (:func:`parse_algorithms`), and whether a key may verify a given algorithm
(:func:`key_fits`). An RSA key never verifies an ``ES*`` or ``HS*`` token and an HMAC secret never
verifies an ``RS*`` one, whatever the token's header says.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from cryptography.x509 import load_pem_x509_certificate
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from jwt.exceptions import InvalidKeyError

from sluice.errors import InvalidArgument

__all__ = [
    "ASYMMETRIC_ALGORITHMS",
    "HMAC_ALGORITHMS",
    "MIN_HMAC_SECRET_BYTES",
    "MIN_RSA_BITS",
    "Jwk",
    "PublicKey",
    "VerifyingKey",
    "jwk_from_dict",
    "key_fits",
    "load_key_file",
    "parse_algorithms",
    "parse_jwks",
]

log = logging.getLogger(__name__)

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey
#: What verifies a signature: a public key, or (HS* only) the shared secret's bytes.
VerifyingKey = PublicKey | bytes

_RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
#: ES* names its curve: a P-384 key verifying an ES256 token would be a downgrade nobody configured.
_EC_CURVES: dict[str, type[ec.EllipticCurve]] = {
    "ES256": ec.SECP256R1,
    "ES384": ec.SECP384R1,
    "ES512": ec.SECP521R1,
}
ASYMMETRIC_ALGORITHMS = _RSA_ALGORITHMS | frozenset(_EC_CURVES)
HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
#: Below 2048 bits an RSA key is factorable by a determined attacker (NIST SP 800-131A).
MIN_RSA_BITS = 2048
#: RFC 7518 3.2: an HMAC key at least as long as the hash output (HS256's 32 bytes, at the least).
MIN_HMAC_SECRET_BYTES = 32


def parse_algorithms(text: str) -> frozenset[str]:
    """The accepted algorithms from ``--jwt-algorithms``: known names only, never ``none``, and
    either all HMAC or all public-key (mixing them is what lets a public key be used as an HMAC
    secret: the algorithm-confusion attack)."""
    names = frozenset(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise InvalidArgument("jwt_algorithms: no algorithm given")
    unknown = names - ASYMMETRIC_ALGORITHMS - HMAC_ALGORITHMS
    if unknown:
        known = ", ".join(sorted(ASYMMETRIC_ALGORITHMS | HMAC_ALGORITHMS))
        raise InvalidArgument(f"jwt_algorithms: not accepted: {', '.join(sorted(unknown))} (known: {known})")
    if names & HMAC_ALGORITHMS and names & ASYMMETRIC_ALGORITHMS:
        raise InvalidArgument(
            "jwt_algorithms: HS* (shared secret) and RS*/PS*/ES* (public key) algorithms are never "
            "mixed in one configuration: a public key would then verify forged HMAC tokens"
        )
    return names


def key_fits(algorithm: str, key: VerifyingKey) -> bool:
    """Whether ``key`` may verify a token signed with ``algorithm`` (already one of the accepted)."""
    if algorithm in HMAC_ALGORITHMS:
        return isinstance(key, bytes)
    if algorithm in _RSA_ALGORITHMS:
        return isinstance(key, rsa.RSAPublicKey)
    curve = _EC_CURVES.get(algorithm)
    return curve is not None and isinstance(key, ec.EllipticCurvePublicKey) and isinstance(key.curve, curve)


@dataclass(frozen=True, slots=True)
class Jwk:
    """One verifying key of a JWKS. ``alg``: the one algorithm the key is for, when the JWKS says so
    (RFC 7517 4.4), else None (any algorithm its type fits)."""

    kid: str | None
    key: PublicKey
    alg: str | None = None

    def fits(self, algorithm: str) -> bool:
        return (self.alg is None or self.alg == algorithm) and key_fits(algorithm, self.key)


def jwk_from_dict(entry: Mapping[str, object]) -> Jwk | None:
    """The verifying key a JWKS entry holds, or None (logged) for one this verifier does not use: not a
    signature key, not RSA or EC, malformed, or an RSA key below :data:`MIN_RSA_BITS`."""
    kty, kid, alg, use = (entry.get(name) for name in ("kty", "kid", "alg", "use"))
    if use not in (None, "sig") or kty not in ("RSA", "EC"):
        return None
    if not (kid is None or isinstance(kid, str)) or not (alg is None or isinstance(alg, str)):
        log.warning("JWKS: skipping a key whose kid or alg is not a string")
        return None
    try:
        parsed = RSAAlgorithm.from_jwk(dict(entry)) if kty == "RSA" else ECAlgorithm.from_jwk(dict(entry))
    except (InvalidKeyError, ValueError, TypeError, KeyError) as exc:
        log.warning("JWKS: skipping key %r: %s", kid, exc)
        return None
    # A JWKS that (wrongly) publishes a private key still only verifies here.
    key = (
        parsed.public_key() if isinstance(parsed, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) else parsed
    )
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < MIN_RSA_BITS:
        log.warning("JWKS: skipping key %r: RSA key of %d bits (< %d)", kid, key.key_size, MIN_RSA_BITS)
        return None
    return Jwk(kid=kid, key=key, alg=alg)


def parse_jwks(raw: bytes) -> dict[str | None, Jwk]:
    """The usable keys of a JWKS document, by kid (keys without a kid under None, the last one wins).
    Raises ValueError when the document is not a JWKS at all."""
    document = json.loads(raw)
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError("not a JWKS document (no 'keys' list)")
    keys: dict[str | None, Jwk] = {}
    for entry in document["keys"]:
        jwk = jwk_from_dict(entry) if isinstance(entry, dict) else None
        if jwk is not None:
            keys[jwk.kid] = jwk
    return keys


def load_key_file(path: Path, algorithms: frozenset[str]) -> VerifyingKey:
    """``--jwt-public-key-file``: with HS* algorithms, the shared secret (the file's bytes, surrounding
    whitespace stripped); otherwise a PEM public key or certificate whose key fits one of
    ``algorithms``. Raises InvalidArgument when it cannot be used."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"jwt_public_key_file: cannot read {path}: {exc.strerror}") from exc
    if algorithms <= HMAC_ALGORITHMS:
        return _hmac_secret(path, data.strip())
    key = _pem_public_key(path, data)
    if not any(key_fits(alg, key) for alg in algorithms):
        raise InvalidArgument(
            f"jwt_public_key_file: the key in {path} fits none of jwt_algorithms "
            f"({', '.join(sorted(algorithms))})"
        )
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < MIN_RSA_BITS:
        raise InvalidArgument(f"jwt_public_key_file: RSA key of {key.key_size} bits (< {MIN_RSA_BITS})")
    return key


def _hmac_secret(path: Path, secret: bytes) -> bytes:
    if len(secret) < MIN_HMAC_SECRET_BYTES:
        raise InvalidArgument(
            f"jwt_public_key_file: the HMAC secret in {path} is {len(secret)} bytes; "
            f"at least {MIN_HMAC_SECRET_BYTES} are required"
        )
    if b"-----BEGIN" in secret:
        raise InvalidArgument(
            f"jwt_public_key_file: {path} holds a PEM key, but jwt_algorithms are HS* (shared secret)"
        )
    return secret


def _pem_public_key(path: Path, data: bytes) -> PublicKey:
    try:
        if b"-----BEGIN CERTIFICATE-----" in data:
            key: object = load_pem_x509_certificate(data).public_key()
        else:
            key = load_pem_public_key(data)
    except ValueError as exc:
        raise InvalidArgument(f"jwt_public_key_file: {path} is not a PEM public key or certificate") from exc
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise InvalidArgument(f"jwt_public_key_file: {path} holds neither an RSA nor an EC public key")
    return key
