"""Authentication on the server side: who a call or connection is, from what it presents.

One :class:`ServerAuthenticator` per service process, asked by both transports (the gRPC interceptor
per call, the wire protocol once per connection, at the hello). What a caller may present, in the
order tried:

1. a bearer token (``authorization: Bearer <token>`` in the call metadata or the hello's map):
   - the cluster token (a Secret every Sluice service holds): the caller is the cluster;
   - a session token (``sluice.security.session_tokens``, returned by a SCRAM login): checked with
     an HMAC in microseconds, and refused once its user's credential generation moved past it
     (the user was deleted or changed password);
   - a JWT (OIDC, Kubernetes ServiceAccount tokens; ``sluice.security.jwt_auth``);
2. a client certificate (mTLS), its subject mapped to a principal by the transport;
3. nothing: anonymous, allowed only with no mechanism configured or ``--allow-anonymous``.

A verified bearer token is cached until it expires, so a call with the same token costs a dict
lookup: authentication happens once per connection in effect, never per call (an attacker cannot
make every call cost a signature check). Failures are counted per address, and an address past the
limit is refused at once (``THROTTLED``) before any verification work.
"""

from __future__ import annotations

import hmac
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from sluice.errors import AuthenticationError, CredentialsExpired, SluiceError
from sluice.security.live_streams import CredentialCheck
from sluice.security.model import ANONYMOUS, Principal
from sluice.security.rate_limit import FailureLimiter, LimiterSettings

__all__ = ["Authenticated", "ServerAuthenticator", "bearer_token"]

#: The cluster principal's name (what audit lines and super-user lists see for Sluice's own services).
CLUSTER_PRINCIPAL = Principal("sluice-cluster", "cluster", cluster=True)
#: Verified tokens kept (a bound, so a flood of distinct valid tokens cannot grow memory).
TOKEN_CACHE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class Authenticated:
    principal: Principal
    #: Wall-clock seconds when the credentials stop being valid (None: they do not expire).
    expires_at: float | None = None
    #: Re-run when the users change (a session token's generation); None: nothing to re-check.
    credentials: CredentialCheck | None = None


ANONYMOUS_CALLER = Authenticated(ANONYMOUS)


class SessionClaimsLike(Protocol):
    @property
    def principal(self) -> str: ...
    @property
    def generation(self) -> int: ...
    @property
    def expires_at(self) -> float: ...


class SessionVerifier(Protocol):
    def verify(self, token: str) -> SessionClaimsLike | None: ...


class VerifiedTokenLike(Protocol):
    @property
    def principal(self) -> str: ...
    @property
    def expires_at(self) -> float: ...


class JwtVerifierLike(Protocol):
    def verify(self, token: str) -> Awaitable[VerifiedTokenLike]: ...


def bearer_token(metadata: Mapping[str, str]) -> str | None:
    """The token of an ``authorization: Bearer <token>`` entry, or None."""
    value = metadata.get("authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationError("the authorization metadata must be 'Bearer <token>'")
    return token.strip()


class ServerAuthenticator:
    """Turns what a caller presents into an :class:`Authenticated` (see the module docstring)."""

    def __init__(
        self,
        *,
        mechanisms: frozenset[str] = frozenset(),
        allow_anonymous: bool = False,
        cluster_token: bytes | None = None,
        sessions: SessionVerifier | None = None,
        jwt: JwtVerifierLike | None = None,
        user_generations: Callable[[], Mapping[str, int]] = dict,
        clock: Callable[[], float] = time.time,
        limiter: FailureLimiter | None = None,
    ) -> None:
        self.mechanisms = mechanisms
        #: No mechanism: every caller is anonymous (the local default); the cluster token still
        #: identifies the services to each other.
        self.required = bool(mechanisms) and not allow_anonymous
        self._cluster_token = cluster_token
        self._sessions = sessions if "scram" in mechanisms else None
        self._jwt = jwt if "jwt" in mechanisms else None
        self._mtls = "mtls" in mechanisms
        self._user_generations = user_generations
        self._clock = clock
        self._cache: OrderedDict[str, Authenticated] = OrderedDict()
        #: Failed token checks per client host: past the limit a host is refused (THROTTLED) before
        #: any verification, so a flood of bad tokens cannot burn the CPU. A cached (valid) token
        #: never reaches it.
        self._limiter = limiter if limiter is not None else FailureLimiter(LimiterSettings())

    @property
    def checks_sessions(self) -> bool:
        return self._sessions is not None

    @property
    def enabled(self) -> bool:
        return bool(self.mechanisms) or self._cluster_token is not None

    # ---- the two entry points ------------------------------------------------------------------

    def authenticate_now(
        self, metadata: Mapping[str, str], cert_principal: str | None, host: str = ""
    ) -> Authenticated | None:
        """The caller, if it can be decided without waiting (everything but a JWT not seen before);
        None: call :meth:`authenticate`. Raises AuthenticationError to refuse."""
        token = bearer_token(metadata)
        if token is None:
            return self._without_token(cert_principal)
        cached = self._cache.get(token)
        if cached is not None:
            if cached.expires_at is None or cached.expires_at > self._clock():
                return cached
            del self._cache[token]
        if self._cluster_token is not None and hmac.compare_digest(token.encode(), self._cluster_token):
            return Authenticated(CLUSTER_PRINCIPAL)
        if self._sessions is not None and not _looks_like_jwt(token):
            self._limiter.check(host)
            try:
                return self._remember(token, self._session(token))
            except AuthenticationError:
                self._limiter.failed(host)
                raise
        if self._jwt is not None and _looks_like_jwt(token):
            return None
        if not self.required:
            return ANONYMOUS_CALLER  # a token nothing here checks, on a cluster without authentication
        raise AuthenticationError("the bearer token is not one this service accepts")

    async def authenticate(
        self, metadata: Mapping[str, str], cert_principal: str | None, host: str = ""
    ) -> Authenticated:
        """The caller; raises AuthenticationError to refuse (Throttled for a host past its failures)."""
        now = self.authenticate_now(metadata, cert_principal, host)
        if now is not None:
            return now
        token = bearer_token(metadata)
        if token is None or self._jwt is None:  # authenticate_now returns None only for a JWT
            raise AuthenticationError("no credentials")
        self._limiter.check(host)
        try:
            verified = await self._jwt.verify(token)
        except AuthenticationError:
            self._limiter.failed(host)
            raise
        return self._remember(token, Authenticated(Principal(verified.principal, "jwt"), verified.expires_at))

    # ---- the mechanisms ------------------------------------------------------------------------

    def _without_token(self, cert_principal: str | None) -> Authenticated:
        if self._mtls and cert_principal:
            return Authenticated(Principal(cert_principal, "mtls"))
        if self.required:
            raise AuthenticationError("no credentials: this service requires authentication")
        return ANONYMOUS_CALLER

    def _session(self, token: str) -> Authenticated:
        assert self._sessions is not None
        claims = self._sessions.verify(token)
        if claims is None:
            raise AuthenticationError("the session token is invalid or expired: log in again")
        name, generation = claims.principal, claims.generation
        err = self._generation_error(name, generation)
        if err is not None:
            raise err

        def still_valid() -> SluiceError | None:
            return self._generation_error(name, generation)

        return Authenticated(Principal(name, "scram"), claims.expires_at, still_valid)

    def _generation_error(self, user: str, generation: int) -> SluiceError | None:
        """A session minted before its user's last password change or deletion is dead. A user this
        service has not heard of yet (the snapshot lags a new user by a moment) is given the benefit."""
        current = self._user_generations().get(user)
        if current is not None and current > generation:
            return CredentialsExpired("this session's user changed its password or was removed: log in again")
        return None

    def _remember(self, token: str, who: Authenticated) -> Authenticated:
        cache = self._cache
        cache[token] = who
        if len(cache) > TOKEN_CACHE_SIZE:
            cache.popitem(last=False)
        return who

    def forget_sessions(self) -> None:
        """The users changed: drop cached session tokens so each is checked against the new
        generations on its next use."""
        for token in [t for t, who in self._cache.items() if who.credentials is not None]:
            del self._cache[token]


def _looks_like_jwt(token: str) -> bool:
    """A JWT is three base64url parts and its header starts ``{"`` (``eyJ``)."""
    return token.startswith("eyJ") and token.count(".") == 2
