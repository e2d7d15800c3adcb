"""Session tokens: what a SCRAM login returns, verified in microseconds by every service.

A login (SCRAM, ``coordinator/auth_servicer.py``) is done once per connection; the token it returns is
then presented on every call, like Kafka's delegation tokens. Format (docs/security.md, "Passwords (SCRAM)
and session tokens")::

    sls1.<payload, base64url>.<HMAC-SHA256 of "sls1.<payload>", base64url>

The payload is ``expiry ms (8 bytes) | generation (8 bytes) | len(mechanism) (1 byte) | mechanism |
principal`` (UTF-8). The MAC covers the token's text, not the decoded bytes, so a change to any character
(even a base64 padding bit that would decode to the same bytes) is refused. The fixed ``sls1.`` prefix lets
the authentication chain tell a session token from a JWT (``eyJ...``) with one ``startswith``.

The key is derived with HKDF from the cluster token, a Secret every service already has, so every service
verifies the sessions any coordinator replica issued and nothing new needs distributing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import InvalidArgument

__all__ = ["PREFIX", "SessionClaims", "SessionTokens", "derive_key", "is_session_token", "read_cluster_token"]

#: Every session token starts with this; a JWT never does (it starts with ``eyJ``).
PREFIX = "sls1."
_HKDF_INFO = b"sluice session tokens v1"
_HEAD = struct.Struct(">QQB")
#: Longest token :meth:`SessionTokens.verify` looks at; anything longer is refused before any work.
MAX_TOKEN_CHARS = 1024
MAX_PRINCIPAL_BYTES = 512


def is_session_token(token: str) -> bool:
    """Whether ``token`` claims to be a session token (and not a JWT): the cheap dispatch test."""
    return token.startswith(PREFIX)


@dataclass(frozen=True, slots=True)
class SessionClaims:
    principal: str
    mechanism: str
    #: The user's generation when the token was issued; refused once the user's generation moved on
    #: (password changed, user deleted), see ``coordinator/users.py``.
    generation: int
    #: Unix time (seconds) after which the token is refused.
    expires_at: float


def derive_key(secret: bytes, purpose: bytes) -> bytes:
    """A 32-byte key for one ``purpose`` from the cluster token (HKDF-SHA256): keys for different
    purposes are independent, and every service holding the token derives the same ones."""
    if not secret:
        raise InvalidArgument("the cluster token is empty")
    # Imported here: cryptography's native module is ~10 MB of RSS, which a service without
    # authentication (the default of `sluice up`) never needs (docs/latency.md, "Memory").
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=purpose).derive(secret)


def read_cluster_token(path: Path) -> bytes:
    """The cluster token file's content without surrounding whitespace (a Secret mounted from
    ``kubectl create secret --from-file`` often ends with a newline)."""
    try:
        token = path.read_bytes().strip()
    except OSError as exc:
        raise InvalidArgument(f"cannot read the cluster token file {path}: {exc.strerror}") from None
    if len(token) < MIN_CLUSTER_TOKEN_BYTES:
        raise InvalidArgument(
            f"the cluster token in {path} is shorter than {MIN_CLUSTER_TOKEN_BYTES} bytes: too easy to guess"
        )
    return token


#: The shortest cluster token accepted (``sluice up`` and the chart make 32 random bytes, base64).
MIN_CLUSTER_TOKEN_BYTES = 16


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionTokens:
    """Mints and verifies session tokens under one key. Thread-safe (immutable after construction)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 32:
            raise InvalidArgument("a session token key must be at least 32 bytes")
        # A keyed HMAC object copied per token: the key schedule is computed once, not per verify.
        self._mac = hmac.new(key, digestmod=hashlib.sha256)

    @classmethod
    def from_cluster_token(cls, secret: bytes) -> SessionTokens:
        """The key every service derives from the cluster token (HKDF-SHA256), so they all agree."""
        return cls(derive_key(secret, _HKDF_INFO))

    @classmethod
    def from_cluster_token_file(cls, path: Path) -> SessionTokens:
        """:meth:`from_cluster_token` on the file's content (:func:`read_cluster_token`)."""
        return cls.from_cluster_token(read_cluster_token(path))

    @classmethod
    def random(cls) -> SessionTokens:
        """A key known to this process only: its tokens verify nowhere else (no cluster token set)."""
        return cls(secrets.token_bytes(32))

    def _sign(self, text: str) -> str:
        mac = self._mac.copy()
        mac.update(text.encode("ascii"))
        return _b64(mac.digest())

    def mint(self, principal: str, mechanism: str, generation: int, ttl_s: float) -> str:
        name = principal.encode("utf-8")
        mech = mechanism.encode("utf-8")
        if not name or len(name) > MAX_PRINCIPAL_BYTES:
            raise InvalidArgument(f"a session principal must be 1-{MAX_PRINCIPAL_BYTES} bytes")
        if len(mech) > 255:
            raise InvalidArgument("a session mechanism must be at most 255 bytes")
        if not 0 <= generation < 2**63 or ttl_s <= 0:
            raise InvalidArgument("a session needs a generation >= 0 and a positive lifetime")
        expires_ms = int((time.time() + ttl_s) * 1000)
        body = PREFIX + _b64(_HEAD.pack(expires_ms, generation, len(mech)) + mech + name)
        return f"{body}.{self._sign(body)}"

    def verify(self, token: str) -> SessionClaims | None:
        """The claims of a genuine, unexpired token; None for anything else (never raises)."""
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not token.startswith(PREFIX):
            return None
        body, dot, signature = token.rpartition(".")
        if not dot or not body.isascii() or not signature.isascii():
            return None
        if not hmac.compare_digest(self._sign(body), signature):
            return None
        try:
            payload = _unb64(body[len(PREFIX) :])
            expires_ms, generation, mech_len = _HEAD.unpack_from(payload)
            mechanism = payload[_HEAD.size : _HEAD.size + mech_len].decode("utf-8")
            principal = payload[_HEAD.size + mech_len :].decode("utf-8")
        except (binascii.Error, struct.error, UnicodeDecodeError, ValueError):
            return None  # signed by us, so unreachable unless the key leaked; refused all the same
        if not principal or expires_ms <= time.time() * 1000:
            return None
        return SessionClaims(principal, mechanism, generation, expires_ms / 1000)

    def verify_current(self, token: str, generations: Mapping[str, int]) -> SessionClaims | None:
        """:meth:`verify`, and the user still exists with the generation the token was issued under
        (``generations``: live users' generations, ``UserStore.generations``). A password
        change or a delete ends the user's sessions here."""
        claims = self.verify(token)
        if claims is None or generations.get(claims.principal) != claims.generation:
            return None
        return claims
