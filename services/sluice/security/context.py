"""Who asks, over what: the request context every request carries, and the authorization seam.

A transport builds one :class:`RequestContext` per gRPC call (the interceptor,
``sluice.server.interceptors``, after authentication) or per wire connection (after the hello,
``sluice.server.wire``), with the caller's :class:`Principal`. The broker's and the dispatcher's cores
take it as an argument into every operation; other code reaches the current gRPC call's context through
:func:`current` (a context variable the interceptor sets, visible to the handler and everything it
awaits).

Authorization asks an :class:`Authorizer` (``sluice.security.service.ServiceAuthorizer`` when ACLs are
on; :class:`AllowAll` otherwise) at one call site per operation, so a rule is written once and holds on
both transports. The process's authorizer is registered once at start (:func:`set_process_authorizer`);
the broker's and the dispatcher's cores are handed the same object.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any, Protocol

from sluice.security.model import ANONYMOUS, Operation, Principal, Resource, ResourceType

__all__ = [
    "ANONYMOUS",
    "GRPC",
    "WIRE",
    "AllowAll",
    "Authorizer",
    "Operation",
    "Principal",
    "RequestContext",
    "Resource",
    "ResourceType",
    "Transport",
    "allowed",
    "authorize",
    "current",
    "process_authorizer",
    "set_current",
    "set_process_authorizer",
]


@dataclass(frozen=True, slots=True)
class Transport:
    """What the transport a request came on can do (the core validates against it)."""

    name: str
    #: It can send a continuous fetch's answers round after round (``docs/wire.md``).
    follows: bool


GRPC = Transport("grpc", follows=False)
WIRE = Transport("wire", follows=True)


@dataclass(frozen=True, slots=True)
class RequestContext:
    """One caller on one transport: built once per connection (wire) or call (gRPC)."""

    principal: Principal
    transport: Transport
    #: A broker replicating from this one (its broker id; a follower's fetch, docs/replication.md),
    #: or -1: a client. Set by the broker core from ``FetchRequest.replica_id`` for that request.
    replica_id: int = -1
    #: The peer's host:port, for the audit log.
    address: str = ""
    #: The live stream or connection this request belongs to (``sluice.security.live_streams``), or
    #: None for a unary call. What a check allows on it is remembered there, so an ACL change or the
    #: end of its credentials can end it.
    stream: Any = None
    #: What the client calls itself (the wire hello's ``client_id``): whom a quota counts an
    #: anonymous caller as (docs/quotas.md). "" when unknown.
    client_id: str = ""


class Authorizer(Protocol):
    """Decides whether ``ctx`` may do ``operation`` on ``resource``."""

    def allowed(self, ctx: RequestContext, operation: Operation, resource: Resource) -> bool:
        """Whether it may (for filtering lists; a denial here is not audited)."""
        ...

    def authorize(self, ctx: RequestContext, operation: Operation, resource: Resource) -> None:
        """Raise ``AuthorizationError`` (audited) unless it may."""
        ...


class AllowAll:
    """Authorization off: every request is allowed."""

    enabled = False

    def allowed(self, ctx: RequestContext, operation: Operation, resource: Resource) -> bool:
        return True

    def authorize(self, ctx: RequestContext, operation: Operation, resource: Resource) -> None:
        return None


_process_authorizer: Authorizer = AllowAll()
_ANONYMOUS_GRPC = RequestContext(ANONYMOUS, GRPC)
_current: contextvars.ContextVar[RequestContext] = contextvars.ContextVar(
    "sluice_request_context", default=_ANONYMOUS_GRPC
)


def set_process_authorizer(authorizer: Authorizer) -> None:
    """Set, once at a service's start, the authorizer every check in this process asks."""
    global _process_authorizer
    _process_authorizer = authorizer


def process_authorizer() -> Authorizer:
    return _process_authorizer


def current() -> RequestContext:
    """The current gRPC call's context (anonymous outside a call: a unit test calling a servicer)."""
    return _current.get()


def set_current(ctx: RequestContext) -> contextvars.Token[RequestContext]:
    return _current.set(ctx)


def allowed(operation: Operation, resource: Resource) -> bool:
    """Whether the current caller may do ``operation`` on ``resource`` (filtering a list)."""
    return _process_authorizer.allowed(_current.get(), operation, resource)


def authorize(operation: Operation, resource: Resource) -> None:
    """Raise AuthorizationError unless the current caller may do ``operation`` on ``resource``."""
    _process_authorizer.authorize(_current.get(), operation, resource)
