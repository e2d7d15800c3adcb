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

from sluice.security.model import ANONYMOUS, Operation, Principal, Resource

__all__ = ["AUDIT_LOGGER", "DENIED", "audit_change", "audit_denied"]

AUDIT_LOGGER = "sluice.audit"
log = logging.getLogger(AUDIT_LOGGER)

DENIED = Counter(
    "sluice_authorization_denied",
    "Requests refused by ACL authorization, by service, operation and resource type",
    ["service", "operation", "resource_type"],
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
