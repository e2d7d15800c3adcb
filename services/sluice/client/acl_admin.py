"""``client.admin``'s ACL methods: create, delete and describe ACL entries on the coordinator.

Entries and filters are :class:`sluice.AclEntry` and :class:`sluice.AclFilter` (exported from ``sluice``);
docs/security.md ("Authorization (ACLs)") is the reference. Every call raises typed ``sluice.errors``:
InvalidArgument for a bad entry (checked here before anything is sent), AuthorizationError without the
right to manage ACLs, RequestTimedOut when the coordinator stays unreachable.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.client.metadata import MetadataCache, call_with_retry
from sluice.client.rpc import call
from sluice.common.peers import Peers
from sluice.errors import InvalidArgument
from sluice.security.acl import AclEntry, AclFilter
from sluice.security.acl_proto import entry_from_proto, entry_to_proto, filter_to_proto
from sluice.v1 import acl_pb2, acl_pb2_grpc

__all__ = ["AclAdmin"]


class AclAdmin:
    """Mixed into ``Admin``: it holds the metadata cache (the bootstrap), the timeout and the channels."""

    _metadata: MetadataCache
    _timeout: float
    _channels: Peers

    def _acls(self) -> acl_pb2_grpc.AclsStub:
        return self._channels.stub(self._metadata.bootstrap, acl_pb2_grpc.AclsStub)

    def create_acls(self, entries: Iterable[AclEntry]) -> int:
        """Add ``entries`` (one already present is left as is). Returns the security version after the
        change; services apply it within moments (docs/security.md, "Distribution")."""
        wanted = list(entries)
        if not wanted:
            raise InvalidArgument("no ACL entries given")
        if not all(isinstance(e, AclEntry) for e in wanted):
            raise InvalidArgument("create_acls takes AclEntry objects (AclEntry.of(...) builds one)")
        request = acl_pb2.CreateAclsRequest(acls=[entry_to_proto(e) for e in wanted])
        # Idempotent (a set): retried while the coordinator is unreachable or changing leaders.
        resp = call_with_retry(lambda: call(self._acls().CreateAcls, request, self._timeout), self._timeout)
        return int(resp.version)

    def delete_acls(self, filters: AclFilter | Iterable[AclFilter]) -> list[AclEntry]:
        """Remove every entry any of ``filters`` matches (``AclFilter()`` matches every entry). Returns the
        entries removed."""
        wanted = [filters] if isinstance(filters, AclFilter) else list(filters)
        if not wanted:
            raise InvalidArgument("no ACL filters given")
        request = acl_pb2.DeleteAclsRequest(filters=[filter_to_proto(f) for f in wanted])
        resp = call_with_retry(lambda: call(self._acls().DeleteAcls, request, self._timeout), self._timeout)
        return [entry_from_proto(e) for e in resp.deleted]

    def describe_acls(self, flt: AclFilter | None = None) -> list[AclEntry]:
        """The entries ``flt`` matches (None: all), sorted by principal, resource type, pattern, name."""
        request = acl_pb2.DescribeAclsRequest(filter=filter_to_proto(flt or AclFilter()))
        resp = call_with_retry(lambda: call(self._acls().DescribeAcls, request, self._timeout), self._timeout)
        return [entry_from_proto(e) for e in resp.acls]
