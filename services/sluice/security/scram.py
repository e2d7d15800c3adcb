"""SCRAM-SHA-256 credentials (RFC 5802/7677): the shapes the SDK computes and the coordinator stores.

A stored credential is (salt, iteration count, StoredKey, ServerKey). It cannot log in: a login proves
knowledge of ClientKey, of which StoredKey is only the hash. So the SDK and the CLI compute it from the
password on the user's side (:func:`make_credential`) and the coordinator never sees the password, not even
when a user is created (docs/security.md, "Passwords (SCRAM) and session tokens").
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from sluice.errors import InvalidArgument

__all__ = [
    "DEFAULT_ITERATIONS",
    "MAX_ITERATIONS",
    "MECHANISM",
    "MIN_ITERATIONS",
    "ScramCredential",
    "make_credential",
    "validate_user_name",
]

MECHANISM = "SCRAM-SHA-256"
#: RFC 7677's minimum (Kafka's default too).
MIN_ITERATIONS = 4096
#: Every login makes the *client* run PBKDF2 this many times (~5 ms at 16384 on one core), never the
#: coordinator: a higher count slows offline guessing from a stolen credential, at the client's cost.
DEFAULT_ITERATIONS = 16384
#: A credential asking for more would make every login slow (and a client trusts what it is sent).
MAX_ITERATIONS = 1_000_000
SALT_BYTES = 16
MIN_SALT_BYTES = 12  # scramp's floor
MAX_SALT_BYTES = 64
KEY_BYTES = 32  # SHA-256
#: User names: what people and scripts are called, e-mail addresses included; no ',' or '=' (SCRAM's
#: own separators) and nothing an ACL or a log line would have to quote.
_USER_NAME = re.compile(r"[A-Za-z0-9._@+-]{1,128}")


def validate_user_name(name: object) -> str:
    if not isinstance(name, str) or not _USER_NAME.fullmatch(name):
        raise InvalidArgument(f"invalid user name {name!r}: use 1-128 characters from [A-Za-z0-9._@+-]")
    return name


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes
    mechanism: str = MECHANISM

    def validate(self) -> ScramCredential:
        """Raise InvalidArgument naming the first field that is out of bounds."""
        if self.mechanism != MECHANISM:
            raise InvalidArgument(f"unsupported mechanism {self.mechanism!r}: only {MECHANISM}")
        if not MIN_SALT_BYTES <= len(self.salt) <= MAX_SALT_BYTES:
            raise InvalidArgument(
                f"salt must be {MIN_SALT_BYTES}-{MAX_SALT_BYTES} bytes, got {len(self.salt)}"
            )
        if isinstance(self.iterations, bool) or not MIN_ITERATIONS <= self.iterations <= MAX_ITERATIONS:
            raise InvalidArgument(
                f"iterations must be {MIN_ITERATIONS}-{MAX_ITERATIONS}, got {self.iterations!r}"
            )
        for field, value in (("stored_key", self.stored_key), ("server_key", self.server_key)):
            if len(value) != KEY_BYTES:
                raise InvalidArgument(f"{field} must be {KEY_BYTES} bytes, got {len(value)}")
        return self


def make_credential(password: str, iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
    """The stored credential for ``password`` (a fresh random salt); runs PBKDF2 here, on the caller's
    side."""
    # Imported here: scramp (and the asn1crypto it pulls in) costs ~15 ms of start-up to every process
    # that imports the SDK, and only computing a credential needs it.
    from scramp import ScramException, ScramMechanism

    if not isinstance(password, str) or not password:
        raise InvalidArgument("the password must not be empty")
    if isinstance(iterations, bool) or not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise InvalidArgument(f"iterations must be {MIN_ITERATIONS}-{MAX_ITERATIONS}, got {iterations!r}")
    try:
        salt, stored, server, count = ScramMechanism(MECHANISM).make_auth_info(
            password, iteration_count=iterations, salt=secrets.token_bytes(SALT_BYTES)
        )
    except ScramException as exc:  # e.g. a password SASLprep prohibits (control characters)
        raise InvalidArgument(f"unusable password: {exc}") from None
    return ScramCredential(salt, count, stored, server)
