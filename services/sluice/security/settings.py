"""The security settings every service takes: one mixin, so every service spells them alike.

Each service's config dataclass inherits :class:`SecuritySettings`, so the flags (``--tls-cert``),
environment (``SLUICE_BROKER_TLS_CERT``) and TOML keys (``tls_cert``) come from the one config loader
(``sluice.server.config``). docs/security.md is the reference; the defaults are the local ones:
plaintext, no authentication, everyone allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

__all__ = ["CLIENT_AUTH_MODES", "MECHANISMS", "SecuritySettings"]

#: ``--tls-client-auth``: whether a client certificate is asked for (``request``) or required.
CLIENT_AUTH_MODES = ("none", "request", "require")
#: ``--auth-mechanisms``: what a client may present. The cluster token is always accepted when set.
MECHANISMS = ("scram", "jwt", "mtls")


@dataclass(frozen=True)
class SecuritySettings:
    # ---- TLS ----------------------------------------------------------------------------------
    tls_cert: Path | None = field(
        default=None,
        metadata={
            "help": "PEM certificate chain this service presents on every listener (gRPC, wire); "
            "re-read when the file changes (cert-manager rotation), no restart. Unset: plaintext"
        },
    )
    tls_key: Path | None = field(default=None, metadata={"help": "PEM private key of --tls-cert"})
    tls_ca: Path | None = field(
        default=None,
        metadata={
            "help": "PEM CA bundle: verifies client certificates (mTLS) and the other services' "
            "certificates when this service calls them"
        },
    )
    tls_client_auth: str = field(
        default="none",
        metadata={"help": "client certificates: none, request (verified if sent) or require"},
    )
    tls_metrics: bool = field(default=False, metadata={"help": "serve /metrics over TLS with --tls-cert too"})
    tls_principal_rules: str = field(
        default="DEFAULT",
        metadata={
            "help": "how a client certificate becomes a principal, Kafka's ssl.principal.mapping.rules "
            "syntax (RULE:pattern/replacement/[LU], ..., DEFAULT: the full subject DN)"
        },
    )
    # ---- authentication -----------------------------------------------------------------------
    auth_mechanisms: str = field(
        default="",
        metadata={
            "help": "comma-separated: scram, jwt, mtls. Empty: no authentication (every caller is "
            "anonymous). Any mechanism turns anonymous access off unless --allow-anonymous"
        },
    )
    allow_anonymous: bool = field(
        default=False,
        metadata={"help": "accept callers with no credentials even with --auth-mechanisms set"},
    )
    cluster_token_file: Path | None = field(
        default=None,
        metadata={
            "help": "file holding the secret Sluice's services present to each other (a Kubernetes "
            "Secret); a caller presenting it is the cluster. Also keys the session tokens"
        },
    )
    session_token_ttl: timedelta = field(
        default=timedelta(minutes=15),
        metadata={"help": "lifetime of the session token a SCRAM login returns"},
    )
    jwt_jwks_url: str = field(
        default="", metadata={"help": "JWKS URL whose keys verify JWT bearer tokens (OIDC, Kubernetes)"}
    )
    jwt_public_key_file: Path | None = field(
        default=None, metadata={"help": "PEM public key verifying JWTs (instead of or with a JWKS URL)"}
    )
    jwt_algorithms: str = field(
        default="RS256,ES256",
        metadata={"help": "accepted JWT algorithms, never taken from the token; HS and RS never mixed"},
    )
    jwt_issuer: str = field(default="", metadata={"help": "required JWT iss (empty: not checked)"})
    jwt_audience: str = field(default="sluice", metadata={"help": "required JWT aud"})
    jwt_principal_claim: str = field(
        default="sub", metadata={"help": "the JWT claim that names the principal"}
    )
    jwt_jwks_ca_file: Path | None = field(
        default=None,
        metadata={
            "help": "PEM CA bundle verifying the JWKS URL's server certificate (in a pod, for the API "
            "server: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt). Unset: the system's roots"
        },
    )
    jwt_jwks_token_file: Path | None = field(
        default=None,
        metadata={
            "help": "file holding a bearer token sent when fetching the JWKS, re-read on every fetch "
            "(the API server's /openid/v1/jwks wants one: "
            "/var/run/secrets/kubernetes.io/serviceaccount/token). Unset: none sent"
        },
    )
    jwt_jwks_refetch_interval: timedelta = field(
        default=timedelta(seconds=10),
        metadata={
            "help": "at most one JWKS fetch per this interval: a token with an unknown kid (a rotated "
            "key) triggers a refetch only this often, so a flood of made-up kids is not a flood of fetches"
        },
    )
    jwt_jwks_max_age: timedelta = field(
        default=timedelta(minutes=10),
        metadata={
            "help": "a JWKS older than this is refetched in the background, so a key removed from it "
            "stops verifying (and the tokens it verified are re-checked)"
        },
    )
    jwt_token_review: bool = field(
        default=False,
        metadata={
            "help": "also ask the Kubernetes TokenReview API (once per token and "
            "--jwt-token-review-interval): refuses a deleted pod's still-unexpired ServiceAccount "
            "token, which a JWKS check cannot see"
        },
    )
    jwt_token_review_interval: timedelta = field(
        default=timedelta(minutes=1),
        metadata={
            "help": "how long a TokenReview answer is trusted before the token is reviewed again "
            "(never past the token's exp): bounds how long a deleted pod's token keeps working"
        },
    )
    # ---- authorization ------------------------------------------------------------------------
    authorization: str = field(
        default="none",
        metadata={"help": "none (everyone may do everything) or acl (default deny, ACLs allow)"},
    )
    super_users: str = field(
        default="", metadata={"help": "comma-separated principals that pass every ACL check"}
    )
