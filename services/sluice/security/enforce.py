"""The authorizer the services ask: ACL decisions, remembered on live streams, denials audited.

It wraps the ACL engine (``sluice.security.acl.AclAuthorizer``: deny wins, default deny, super users,
a decision cache) with what a request path needs around a decision:

- a right allowed on a live stream is remembered on it, so an ACL change can end the stream;
- a denial is audited (one structured log line and a counter) and raised as ``AuthorizationError``
  naming the operation and the resource as the caller asked, never whether the resource exists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sluice.errors import AuthorizationError
from sluice.security.context import RequestContext
from sluice.security.model import Operation, Principal, Resource, ResourceType

__all__ = ["AclDecisions", "ServiceAuthorizer"]


class AclDecisions(Protocol):
    def allowed(self, principal: Principal, operation: Operation, resource: Resource) -> bool: ...

    def allowed_on_some(
        self, principal: Principal, operation: Operation, resource_type: ResourceType
    ) -> bool: ...


Audit = Callable[[Principal, Operation, Resource, str], None]

#: The suffix of a push subscription's dead-letter topic (``dispatcher``: ``<topic>.<subscription>.DLQ``).
DLQ_SUFFIX = ".DLQ"
#: The suffix of the topic its redrive writes to (``sluice dlq redrive --subscription``, read by the
#: subscription's own consumers: docs/retry.md).
REDRIVE_SUFFIX = ".REDRIVE"
_SUBSCRIPTION_TOPIC_SUFFIXES = (DLQ_SUFFIX, REDRIVE_SUFFIX)
_DEAD_LETTER_OPERATIONS = frozenset({Operation.READ, Operation.DESCRIBE, Operation.DELETE})


class ServiceAuthorizer:
    """The process's authorizer when ``--authorization acl`` (see the module docstring)."""

    enabled = True

    def __init__(self, acls: AclDecisions, audit: Audit) -> None:
        self._acls = acls
        self._audit = audit

    def allowed(self, ctx: RequestContext, operation: Operation, resource: Resource) -> bool:
        ok = self._acls.allowed(ctx.principal, operation, resource) or self._dead_letters_allowed(
            ctx.principal, operation, resource
        )
        if ok and ctx.stream is not None:
            ctx.stream.remember(operation, resource)
        return ok

    def authorize(self, ctx: RequestContext, operation: Operation, resource: Resource) -> None:
        if self.allowed(ctx, operation, resource):
            return
        self._audit(ctx.principal, operation, resource, ctx.address)
        who = ctx.principal.name or "an anonymous caller"
        raise AuthorizationError(f"{who} is not authorized to {operation.value} {resource}")

    def _dead_letters_allowed(self, principal: Principal, operation: Operation, resource: Resource) -> bool:
        """A push subscription's dead-letter topic ``<topic>.<subscription>.DLQ``, and the topic its
        redrive writes (``<topic>.<subscription>.REDRIVE``), are read, described and deleted under the
        subscription's ACLs (docs/security.md): whoever may read a subscription gets its dead letters
        back, and nobody needs an ACL on a topic name they never chose. Topic and subscription names
        may both hold dots, so every split is asked (only for names with those suffixes)."""
        if resource.type is not ResourceType.TOPIC or operation not in _DEAD_LETTER_OPERATIONS:
            return False
        suffix = next((x for x in _SUBSCRIPTION_TOPIC_SUFFIXES if resource.name.endswith(x)), None)
        if suffix is None:
            return False
        base = resource.name[: -len(suffix)]
        return any(
            self._acls.allowed(principal, operation, Resource(ResourceType.SUBSCRIPTION, base[i + 1 :]))
            for i, char in enumerate(base)
            if char == "." and 0 < i < len(base) - 1
        )

    def allowed_on_some(self, ctx: RequestContext, operation: Operation, resource_type: ResourceType) -> bool:
        return self._acls.allowed_on_some(ctx.principal, operation, resource_type)
