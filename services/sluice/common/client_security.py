"""What a client presents: TLS settings and a token source (docs/security.md, "Clients").

One :class:`ClientSecurity` per identity. The SDK builds one per ``Client`` (``tls=``, ``token=``,
``username=``/``password=``); a service builds one for its own calls to other services
(:func:`process_security`: its certificate and the cluster token), used by every ``AioPeers`` and wire
connection in that process that is not given another. The peer layer (``sluice.common.peers``) and the
wire clients are the only users: they ask it for channel credentials, an SSL context and the metadata to
send, so no other module knows how credentials travel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import CredentialsError, CredentialsExpired

__all__ = [
    "AUTHORIZATION_KEY",
    "ClientSecurity",
    "TLSConfig",
    "TokenSource",
    "process_security",
    "refreshable",
    "refused",
    "retriable_refusal",
    "set_process_security",
]

#: The metadata key (gRPC call metadata, the wire hello's metadata map) that carries a bearer token.
AUTHORIZATION_KEY = "authorization"

#: Returns the token to send now (a fresh one when the last is about to expire). Called per call or
#: connection, so it must be cheap when the token is still good.
TokenSource = Callable[[], str]


@dataclass(frozen=True)
class TLSConfig:
    """TLS towards Sluice's services. ``ca``: the CA bundle that verifies the services' certificates
    (None: the system's roots). ``cert``/``key``: this client's certificate, for mTLS.
    ``server_name``: the name to verify instead of the address's host (an IP address, a tunnel)."""

    ca: str | Path | None = None
    cert: str | Path | None = None
    key: str | Path | None = None
    server_name: str | None = None


@dataclass(frozen=True)
class ClientSecurity:
    """TLS (or None: plaintext) and a token source (or None: no token) for one identity."""

    tls: TLSConfig | None = None
    token: TokenSource | None = None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call and every wire hello carries."""
        if self.token is None:
            return ()
        return ((AUTHORIZATION_KEY, f"Bearer {self.token()}"),)


PLAINTEXT = ClientSecurity()
_process = PLAINTEXT


def set_process_security(security: ClientSecurity) -> None:
    """Set, once at a service's start, how this process calls the other services."""
    global _process
    _process = security


def process_security() -> ClientSecurity:
    """How this process calls the other services (plaintext, no token, until a service sets it)."""
    return _process


# ---- a refused token: tell its source (a login or a file can get a new one) ---------------------------


def refreshable(security: ClientSecurity | None) -> bool:
    """True if ``security``'s token source can get a new token after a refusal (a login, a file)."""
    return security is not None and callable(getattr(security.token, "refused", None))


def refused(security: ClientSecurity | None, token: str | None = None) -> bool:
    """A server refused ``token`` (None: the one last sent): tell the source. True if it can get a
    new one, so trying again makes sense."""
    if not refreshable(security):
        return False
    assert security is not None
    getattr(security.token, "refused")(token)  # noqa: B009 (a duck-typed token source)
    return True


def retriable_refusal(security: ClientSecurity | None, error: CredentialsError) -> CredentialsError:
    """The error to raise for a refusal at a connection's hello: a retriable CredentialsExpired when
    the source can get a new token (the caller's retry loop then reconnects with it), else ``error``."""
    if error.__cause__ is not None:  # the TLS session refused (a certificate), not the token
        return error
    if isinstance(error, CredentialsExpired):
        refused(security)
        return error
    if refused(security):
        return CredentialsExpired(f"{error.message} (a new token is fetched for the next attempt)")
    return error
