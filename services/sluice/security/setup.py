"""Build one service process's security from its settings: the single place every service calls.

``build(service, settings, coordinator)`` returns the :class:`~sluice.security.service.ServiceSecurity`
the service hands to its gRPC server and wire listeners, and registers the process's authorizer. A
service that is not the coordinator also gets a :class:`~sluice.security.watcher.SecurityWatcher`
(started and stopped by the service's main with :meth:`ServiceSecurity.start`/``stop``) that keeps
its ACLs and user generations current; the coordinator feeds its own from the ACL servicer.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from sluice.common.client_security import ClientSecurity, TLSConfig
from sluice.common.client_tls import check_tls
from sluice.errors import InvalidArgument
from sluice.security.acl import AclAuthorizer
from sluice.security.audit import audit_denied
from sluice.security.authenticate import ServerAuthenticator, SessionVerifier
from sluice.security.context import AllowAll, Authorizer, set_process_authorizer
from sluice.security.enforce import ServiceAuthorizer
from sluice.security.model import Operation, Principal, Resource
from sluice.security.service import ServiceSecurity
from sluice.security.session_tokens import SessionTokens, read_cluster_token
from sluice.security.settings import MECHANISMS, SecuritySettings

__all__ = ["build", "mechanisms_of", "service_security"]


def mechanisms_of(settings: SecuritySettings) -> frozenset[str]:
    names = frozenset(m.strip().lower() for m in settings.auth_mechanisms.split(",") if m.strip())
    unknown = names - set(MECHANISMS)
    if unknown:
        raise InvalidArgument(
            f"--auth-mechanisms: unknown {', '.join(sorted(unknown))} (known: {', '.join(MECHANISMS)})"
        )
    return names


def build(
    service: str, settings: SecuritySettings, coordinator: str = "", sessions: SessionVerifier | None = None
) -> ServiceSecurity:
    """The service's security (see the module docstring). ``coordinator``: where its watcher asks
    for ACLs and users ("" for the coordinator itself, which calls ``watch`` once bound). ``sessions``:
    the coordinator's own session tokens (it mints them, with or without a cluster token)."""
    mechanisms = mechanisms_of(settings)
    path = settings.cluster_token_file
    cluster_token = read_cluster_token(path) if path is not None else None
    if sessions is None and "scram" in mechanisms:
        if cluster_token is None:
            raise InvalidArgument(
                "--auth-mechanisms scram needs --cluster-token-file: the session tokens a login returns "
                "are keyed with it, so every service can verify them"
            )
        sessions = SessionTokens.from_cluster_token(cluster_token)
    acls = AclAuthorizer.from_settings(settings)
    # JWT and client-certificate principals are imported only when configured: they load
    # cryptography's native module (~10 MB of RSS per process; docs/latency.md, "Memory").
    jwt = None
    if "jwt" in mechanisms:
        from sluice.security.jwt_auth import JwtVerifier

        jwt = JwtVerifier.from_settings(settings)

    def generations() -> Mapping[str, int]:  # the watcher comes after the authenticator
        return security.user_generations()

    authenticator = ServerAuthenticator(
        mechanisms=mechanisms,
        allow_anonymous=settings.allow_anonymous,
        cluster_token=cluster_token,
        sessions=sessions,
        jwt=jwt,
        user_generations=generations,
    )
    authorizer: Authorizer = (
        ServiceAuthorizer(acls, functools.partial(_audit, service)) if acls.enabled else AllowAll()
    )
    mapper = None
    if "mtls" in mechanisms:
        from sluice.security.cert_principal import PrincipalMapper

        mapper = PrincipalMapper(settings.tls_principal_rules)
    security = ServiceSecurity(
        service,
        authenticator,
        authorizer,
        grpc_cert_principal=mapper.principal_from_grpc_auth_context if mapper is not None else None,
        wire_cert_principal=mapper.principal_from_peer_cert if mapper is not None else None,
        acls=acls,
    )
    security.watch(coordinator)

    def acls_changed(_acls: object) -> None:
        security.recheck_streams()

    acls.on_change(acls_changed)
    set_process_authorizer(authorizer)
    return security


def _audit(
    service: str, principal: Principal, operation: Operation, resource: Resource, address: str
) -> None:
    audit_denied(principal, operation, resource, address, service)


def service_security(settings: SecuritySettings) -> ClientSecurity:
    """How a service calls the others (its ``set_process_security`` at start): TLS verified by
    ``tls_ca`` and its own certificate (mTLS) when it has TLS settings; the cluster token when
    ``cluster_token_file`` is set. The token file is read once, here: a rotated cluster token
    takes a restart (the Secret changes rarely; a rolling restart picks it up)."""
    tls = None
    if settings.tls_cert is not None or settings.tls_ca is not None:
        tls = TLSConfig(ca=settings.tls_ca, cert=settings.tls_cert, key=settings.tls_key)
        check_tls(tls)
    path = settings.cluster_token_file
    if path is None:
        return ClientSecurity(tls=tls)
    value = read_cluster_token(path).decode()
    return ClientSecurity(tls=tls, token=lambda: value)
