"""The audit log: one structured line per denied request and per security-relevant change.

Lines go to the logger ``sluice.audit`` at INFO (changes) and WARNING (denials), each one JSON object, so
a log pipeline can route them apart from the service's own log and parse them without a grammar:

    {"event": "denied", "principal": "alice", "mechanism": "scram", "operation": "read",
     "resource_type": "topic", "resource": "orders", "address": "ipv4:10.0.0.7:51234",
     "service": "broker"}
    {"event": "change", "principal": "admin", "action": "acl.add", "detail": {...},
     "address": "ipv4:10.0.0.9:40100"}

Denials are counted too: ``sluice_authorization_denied_total{service, operation, resource_type}`` (never
by principal or resource name: those are unbounded label values).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from prometheus_client import Counter

from sluice.errors import SluiceError, Throttled
from sluice.security.context import current
from sluice.security.model import ANONYMOUS, Operation, Principal, Resource

__all__ = [
    "AUDIT_LOGGER",
    "DENIED",
    "UNAUTHENTICATED",
    "audit_change",
    "audit_current",
    "audit_denied",
    "audit_unauthenticated",
]

AUDIT_LOGGER = "sluice.audit"
log = logging.getLogger(AUDIT_LOGGER)

DENIED = Counter(
    "sluice_authorization_denied",
    "Requests refused by ACL authorization, by service, operation and resource type",
    ["service", "operation", "resource_type"],
)


UNAUTHENTICATED = Counter(
    "sluice_authentication_failed",
    "Calls and connections refused for their credentials, by service and reason (refused, throttled)",
    ["service", "reason"],
)


def _line(doc: Mapping[str, object]) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=False, default=str)


def audit_denied(
    principal: Principal, operation: Operation, resource: Resource, address: str, service: str
) -> None:
    """Record a refused request: one WARNING line and the counter. Caller: wherever AuthorizationError is
    raised for a request (the integrator's guard)."""
    DENIED.labels(service, operation.value, resource.type.value).inc()
    log.warning(
        "%s",
        _line(
            {
                "event": "denied",
                "principal": principal.name,
                "mechanism": principal.mechanism,
                "operation": operation.value,
                "resource_type": resource.type.value,
                "resource": resource.name,
                "address": address,
                "service": service,
            }
        ),
    )


def audit_change(
    principal: Principal | None, action: str, detail: Mapping[str, object], address: str = ""
) -> None:
    """Record a security-relevant change (``acl.add``, ``acl.remove``, ``user.add``, ``topic.delete``,
    ``offsets.reset``...): one INFO line naming who, what and from where."""
    who = principal or ANONYMOUS
    log.info(
        "%s",
        _line(
            {
                "event": "change",
                "principal": who.name,
                "mechanism": who.mechanism,
                "action": action,
                "detail": dict(detail),
                "address": address,
            }
        ),
    )


def audit_current(action: str, detail: Mapping[str, object]) -> None:
    """:func:`audit_change` for the current gRPC call's caller (``sluice.security.context.current``)."""
    ctx = current()
    audit_change(ctx.principal, action, detail, ctx.address)


def audit_unauthenticated(service: str, address: str, err: SluiceError) -> None:
    """A call or connection refused for its credentials: one WARNING line and the counter. A throttled
    one (an address past its failures) is only counted: a flood must not flood the log too."""
    throttled = isinstance(err, Throttled)
    UNAUTHENTICATED.labels(service, "throttled" if throttled else "refused").inc()
    if not throttled:
        log.warning(
            "%s",
            _line(
                {"event": "unauthenticated", "reason": err.message, "address": address, "service": service}
            ),
        )
