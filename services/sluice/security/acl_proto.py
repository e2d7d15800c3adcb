"""ACL entries and filters to and from ``sluice.v1.acl`` messages: one spelling on every side.

Caller: the coordinator's Acls servicer, the security watcher in every service, the admin SDK. Decoding
validates every field (InvalidArgument naming it), so a bad request never reaches the store.
"""

from __future__ import annotations

from sluice.errors import InvalidArgument
from sluice.security.acl import (
    MAX_NAME,
    AclEntry,
    AclFilter,
    AclOperation,
    PatternType,
    Permission,
    parse_enum,
    parse_operation,
)
from sluice.security.model import ResourceType
from sluice.v1 import acl_pb2 as pb

__all__ = ["entry_from_proto", "entry_to_proto", "filter_from_proto", "filter_to_proto"]


def entry_to_proto(entry: AclEntry) -> pb.AclEntry:
    return pb.AclEntry(**entry.to_dict())


def entry_from_proto(msg: pb.AclEntry) -> AclEntry:
    """The entry a message carries; InvalidArgument for any missing or unknown field."""
    return AclEntry.of(
        principal=msg.principal,
        resource_type=msg.resource_type,
        name=msg.name,
        operation=msg.operation,
        permission=msg.permission,
        pattern=msg.pattern,
    )


def filter_to_proto(flt: AclFilter) -> pb.AclFilter:
    return pb.AclFilter(
        principal=flt.principal or "",
        resource_type=flt.resource_type.value if flt.resource_type else "",
        pattern=flt.pattern.value if flt.pattern else "",
        name=flt.name or "",
        operation=flt.operation.value if flt.operation else "",
        permission=flt.permission.value if flt.permission else "",
    )


def filter_from_proto(msg: pb.AclFilter) -> AclFilter:
    """The filter a message carries (empty fields match anything); InvalidArgument for unknown values."""
    operation: AclOperation | None = parse_operation(msg.operation) if msg.operation else None
    rtype = parse_enum(ResourceType, msg.resource_type, "resource type") if msg.resource_type else None
    flt = AclFilter(
        principal=msg.principal or None,
        resource_type=rtype,
        pattern=parse_enum(PatternType, msg.pattern, "pattern type") if msg.pattern else None,
        name=msg.name or None,
        operation=operation,
        permission=parse_enum(Permission, msg.permission, "permission") if msg.permission else None,
    )
    if len(msg.principal) > MAX_NAME or len(msg.name) > MAX_NAME:
        raise InvalidArgument(f"an ACL filter's principal and name are at most {MAX_NAME} characters")
    return flt
