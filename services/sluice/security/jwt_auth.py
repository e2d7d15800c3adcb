"""JWT bearer-token verification: OIDC providers and Kubernetes ServiceAccount tokens
(docs/security.md, "JWT and Kubernetes ServiceAccount tokens").

:class:`JwtVerifier` turns a bearer token into a :class:`VerifiedToken` (the principal, the expiry)
or raises :class:`~sluice.errors.AuthenticationError`. The rules, each closing a known attack:

- the algorithm comes from the configuration, never from the token: a token whose header names any
  other (``none`` included) is refused before any key is touched, and a key verifies only the
  algorithms its type fits (``jwt_keys.key_fits``), so a public key is never an HMAC secret;
- ``exp`` is required (a token without one would be valid forever), ``iss`` and ``aud`` are checked
  when configured, and the principal claim must be a non-empty string of printable characters;
- clocks may disagree by :data:`LEEWAY_SECONDS` (``exp``, ``nbf``, ``iat``).

A verified token is cached by its string until its ``exp`` (or, with TokenReview, until the review is
due again), so every later presentation costs a dictionary lookup. Messages never include the token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from jwt.types import Options

from sluice.errors import AuthenticationError, InvalidArgument
from sluice.security.jwks import JwksCache, JwksFetcher
from sluice.security.jwt_keys import HMAC_ALGORITHMS, VerifyingKey, key_fits, load_key_file, parse_algorithms
from sluice.security.model import Principal
from sluice.security.settings import SecuritySettings
from sluice.security.token_cache import DEFAULT_MAX_ENTRIES, TokenCache
from sluice.security.token_review import TokenReviewer

__all__ = ["LEEWAY_SECONDS", "MAX_TOKEN_CHARS", "JwtVerifier", "KubernetesIdentity", "VerifiedToken"]

log = logging.getLogger(__name__)

#: Tolerated clock difference between the issuer and this host, in seconds, for exp/nbf/iat. Small:
#: it extends every token's life by this much, and NTP keeps real clocks well within it.
LEEWAY_SECONDS = 30
#: A longer "token" is not one (a Kubernetes token is ~1 KiB); refusing it early bounds parsing work
#: and the memory the cache can hold.
MAX_TOKEN_CHARS = 8192
#: A principal name goes into ACLs and audit lines: printable and bounded.
MAX_PRINCIPAL_CHARS = 1024

_PROBLEMS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "the token has expired"),
    (jwt.ImmatureSignatureError, "the token is not valid yet (nbf or iat in the future)"),
    (jwt.InvalidAudienceError, "the token is not for this audience (aud)"),
    (jwt.InvalidIssuerError, "the token is from another issuer (iss)"),
    (jwt.InvalidSignatureError, "the signature does not verify"),
)


@dataclass(frozen=True, slots=True)
class KubernetesIdentity:
    """The ``kubernetes.io`` claim of a ServiceAccount token: where the caller runs (for the audit log)."""

    namespace: str
    serviceaccount: str
    pod: str = ""


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    """What a verified JWT says. ``expires_at``: its ``exp``, epoch seconds (a stream authenticated with
    it ends then). ``issuer``, ``subject``, ``key_id``, ``token_id`` (``jti``) and ``kubernetes`` are for
    the audit log; empty when the token lacks them."""

    principal: str
    expires_at: int
    issuer: str = ""
    subject: str = ""
    key_id: str = ""
    token_id: str = ""
    kubernetes: KubernetesIdentity | None = None

    def to_principal(self) -> Principal:
        return Principal(name=self.principal, mechanism="jwt")


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _kubernetes_identity(claims: Mapping[str, Any]) -> KubernetesIdentity | None:
    claim = claims.get("kubernetes.io")
    if not isinstance(claim, dict):
        return None
    namespace = _text(claim.get("namespace"))
    serviceaccount = claim.get("serviceaccount")
    pod = claim.get("pod")
    sa_name = _text(serviceaccount.get("name")) if isinstance(serviceaccount, dict) else ""
    pod_name = _text(pod.get("name")) if isinstance(pod, dict) else ""
    return KubernetesIdentity(namespace=namespace, serviceaccount=sa_name, pod=pod_name)


def _shown(value: str) -> str:
    """A header value (attacker input) fit for a message: quoted, escaped, short."""
    return repr(value[:40] + ("..." if len(value) > 40 else ""))


class JwtVerifier:
    """Verifies JWT bearer tokens against a static key and/or a JWKS. Build it with
    :meth:`from_settings`; the keyword constructor is for tests and other wiring."""

    def __init__(
        self,
        *,
        algorithms: frozenset[str],
        principal_claim: str = "sub",
        issuer: str = "",
        audience: str = "",
        static_key: VerifyingKey | None = None,
        jwks: JwksCache | None = None,
        reviewer: TokenReviewer | None = None,
        review_interval: float = 60.0,
        max_cached: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if static_key is None and jwks is None:
            raise InvalidArgument(
                "jwt: set jwt_jwks_url or jwt_public_key_file (no key to verify tokens with)"
            )
        if not principal_claim:
            raise InvalidArgument("jwt_principal_claim: empty")
        self._algorithms = algorithms
        self._accepted = ", ".join(sorted(algorithms))
        self._principal_claim = principal_claim
        self._issuer = issuer
        self._audience = audience
        self._static_key = static_key
        self._jwks = jwks
        self._reviewer = reviewer
        self._review_interval = review_interval
        self._clock = clock
        self._cache: TokenCache[VerifiedToken] = TokenCache(max_cached)
        self._jwks_revision = 0
        required = ["exp"] + (["iss"] if issuer else []) + (["aud"] if audience else [])
        self._options: Options = {
            "require": required,
            "verify_aud": bool(audience),
            "enforce_minimum_key_length": True,
        }

    @classmethod
    def from_settings(cls, settings: SecuritySettings, **kwargs: Any) -> JwtVerifier:
        """The verifier the settings describe; InvalidArgument (at start, not at the first token) for
        a configuration that cannot be safe: no key, HS mixed with RS/ES/PS, HS with a JWKS URL, an
        unknown algorithm, an unreadable or unfitting key file, a plain-http JWKS URL."""
        algorithms = parse_algorithms(settings.jwt_algorithms)
        static_key = None
        if settings.jwt_public_key_file is not None:
            static_key = load_key_file(settings.jwt_public_key_file, algorithms)
        jwks = None
        if settings.jwt_jwks_url:
            if algorithms <= HMAC_ALGORITHMS:
                raise InvalidArgument(
                    "jwt_jwks_url: a JWKS publishes public keys; HS* algorithms use a secret"
                )
            fetcher = JwksFetcher(
                settings.jwt_jwks_url,
                ca_file=settings.jwt_jwks_ca_file,
                token_file=settings.jwt_jwks_token_file,
            )
            jwks = JwksCache(
                fetcher.fetch,
                refetch_interval=settings.jwt_jwks_refetch_interval.total_seconds(),
                max_age=settings.jwt_jwks_max_age.total_seconds(),
            )
        if not settings.jwt_audience:
            log.warning("jwt_audience is empty: tokens the issuer made for any other audience are accepted")
        audiences = [settings.jwt_audience] if settings.jwt_audience else []
        reviewer = TokenReviewer.in_cluster(audiences) if settings.jwt_token_review else None
        return cls(
            algorithms=algorithms,
            principal_claim=settings.jwt_principal_claim,
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience,
            static_key=static_key,
            jwks=jwks,
            reviewer=reviewer,
            review_interval=settings.jwt_token_review_interval.total_seconds(),
            **kwargs,
        )

    async def verify(self, token: str) -> VerifiedToken:
        """The verified token, or AuthenticationError saying why not. ``token`` is the bare JWT (no
        ``Bearer`` prefix). A token verified before and still valid costs one dictionary lookup."""
        now = self._clock()
        if self._jwks is not None and self._jwks.revision != self._jwks_revision:
            # A key was removed from the JWKS: what it verified must be verified again.
            self._jwks_revision = self._jwks.revision
            self._cache.clear()
        cached = self._cache.get(token, now) if isinstance(token, str) else None
        if cached is not None:
            return cached
        verified = await self._verify_uncached(token)
        valid_until = float(verified.expires_at)
        if self._reviewer is not None:
            await self._reviewer.review(token, verified.subject)
            valid_until = min(valid_until, now + self._review_interval)
        self._cache.put(token, verified, valid_until, self._clock())
        return verified

    async def _verify_uncached(self, token: object) -> VerifiedToken:
        if not isinstance(token, str) or not token:
            raise AuthenticationError("JWT refused: no token")
        if len(token) > MAX_TOKEN_CHARS:
            raise AuthenticationError(f"JWT refused: longer than {MAX_TOKEN_CHARS} characters")
        header = self._header(token)
        algorithm = header.get("alg")
        if not isinstance(algorithm, str) or algorithm not in self._algorithms:
            shown = _shown(algorithm) if isinstance(algorithm, str) else "none given"
            raise AuthenticationError(
                f"JWT refused: algorithm {shown} is not accepted (accepted: {self._accepted})"
            )
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise AuthenticationError("JWT refused: its kid is not a string")
        key = await self._key(kid, algorithm)
        claims = self._decode(token, key, algorithm)
        return self._result(claims, kid)

    @staticmethod
    def _header(token: str) -> dict[str, Any]:
        try:
            header = jwt.get_unverified_header(token)
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            raise AuthenticationError("JWT refused: not a well-formed JWT") from exc
        return header

    async def _key(self, kid: str | None, algorithm: str) -> VerifyingKey:
        """The one key that may verify this token: the JWKS's key named ``kid`` (after a rate-limited
        refetch if unknown), else the static key; for a token without a kid, the only fitting key."""
        candidates: list[VerifyingKey] = []
        if self._jwks is not None:
            candidates = [jwk.key for jwk in await self._jwks.find(kid) if jwk.fits(algorithm)]
        if not candidates and self._static_key is not None and key_fits(algorithm, self._static_key):
            candidates = [self._static_key]
        if len(candidates) == 1:
            return candidates[0]
        if candidates:
            raise AuthenticationError("JWT refused: it names no key (kid) and several keys could verify it")
        if kid is None:
            raise AuthenticationError(f"JWT refused: no key for algorithm {algorithm}")
        unavailable = (
            f" (JWKS unavailable: {self._jwks.last_error})" if self._jwks and self._jwks.last_error else ""
        )
        raise AuthenticationError(f"JWT refused: no key with kid {_shown(kid)} for {algorithm}{unavailable}")

    def _decode(self, token: str, key: VerifyingKey, algorithm: str) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self._audience or None,
                issuer=self._issuer or None,
                leeway=LEEWAY_SECONDS,
                options=self._options,
            )
        except jwt.MissingRequiredClaimError as exc:
            raise AuthenticationError(f"JWT refused: the token has no {exc.claim} claim") from None
        except jwt.PyJWTError as exc:
            raise AuthenticationError(f"JWT refused: {_problem(exc)}") from None
        except (ValueError, TypeError) as exc:  # a key type PyJWT cannot use: a configuration bug
            raise AuthenticationError(f"JWT refused: {type(exc).__name__}") from None
        return claims

    def _result(self, claims: Mapping[str, Any], kid: str | None) -> VerifiedToken:
        principal = claims.get(self._principal_claim)
        if not isinstance(principal, str) or not principal:
            raise AuthenticationError(
                f"JWT refused: claim {self._principal_claim!r} is not a non-empty string"
            )
        if len(principal) > MAX_PRINCIPAL_CHARS or not principal.isprintable():
            raise AuthenticationError(f"JWT refused: claim {self._principal_claim!r} is not a printable name")
        return VerifiedToken(
            principal=principal,
            expires_at=int(claims["exp"]),
            issuer=_text(claims.get("iss")),
            subject=_text(claims.get("sub")),
            key_id=kid or "",
            token_id=_text(claims.get("jti")),
            kubernetes=_kubernetes_identity(claims),
        )


def _problem(exc: jwt.PyJWTError) -> str:
    for kind, text in _PROBLEMS:
        if isinstance(exc, kind):
            return text
    # PyJWT's own messages name what is malformed ("Invalid header padding"), never the token.
    return f"{type(exc).__name__}: {str(exc)[:120]}"
