"""Who asks, over what: the request context every core operation takes, and the authorization seam.

Shared by the services whose data plane has two transports: the broker
(:class:`~sluice.broker.service.BrokerService`) and the dispatcher
(:class:`~sluice.dispatcher.service.DispatcherService`). A transport adapter (the gRPC servicer, a
wire connection) builds one :class:`RequestContext` and passes it with each call into the core. The core
asks :meth:`Authorizer.authorize` before it touches a partition or changes the broker's
assignment, at one call site per operation, so an authorization rule is written once and holds
on both transports.

Today every caller is :data:`ANONYMOUS` and :class:`AllowAll` allows everything. The security
issue fills the seam in two places and adds no third copy of any request path:

- authentication: ``sluice.server.interceptors.Authenticator`` (gRPC interceptor, wire hello)
  returns the caller's :class:`Principal`; each adapter puts it into its context at one line
  (``BrokerServicer.context`` and ``_BrokerConnection.opened``; the dispatcher's
  ``DispatcherServicer.context`` and ``_ConsumeConnection.opened``);
- authorization: an :class:`Authorizer` given to the service replaces :class:`AllowAll`, and a
  refusal is a ``SluiceError`` (per partition where the core answers per partition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sluice.security.model import ANONYMOUS, Operation, Principal

__all__ = [
    "ANONYMOUS",
    "GRPC",
    "WIRE",
    "AllowAll",
    "Authorizer",
    "Operation",
    "Principal",
    "RequestContext",
    "Transport",
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


class Authorizer(Protocol):
    """Decides whether ``ctx`` may do ``operation`` on ``resource`` (a topic name, or ``""``
    for the cluster). Raises a ``SluiceError`` to refuse."""

    def authorize(self, ctx: RequestContext, operation: Operation, resource: str) -> None: ...


class AllowAll:
    """The authorizer until the security issue: every request is allowed."""

    def authorize(self, ctx: RequestContext, operation: Operation, resource: str) -> None:
        return None
