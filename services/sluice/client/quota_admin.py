"""``client.admin``'s quota methods: set, delete and describe client quotas on the coordinator.

An entity is ``QuotaKey(Kind.USER, name)`` (an authenticated principal) or ``QuotaKey(Kind.CLIENT,
client_id)`` (an anonymous caller, by the client id it announces); the name ``""`` is the default of
its kind. Limits are ``sluice.quotas.model.Limits`` (rates per second, 0: unlimited). docs/quotas.md
is the reference. Typed errors: InvalidArgument, AuthorizationError (no ``alter``/``describe`` on the
cluster), RequestTimedOut.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sluice.client.metadata import MetadataCache, call_with_retry
from sluice.client.rpc import call
from sluice.common.peers import Peers
from sluice.errors import InvalidArgument
from sluice.quotas.model import Kind, Limits, QuotaKey, entity_from_proto, limits_from_proto, quota_to_proto
from sluice.v1 import quota_pb2, quota_pb2_grpc

__all__ = ["QuotaAdmin"]


class QuotaAdmin:
    """Mixed into ``Admin``: it holds the metadata cache (the bootstrap), the timeout and the channels."""

    _metadata: MetadataCache
    _timeout: float
    _channels: Peers

    def _quotas(self) -> quota_pb2_grpc.QuotasStub:
        return self._channels.stub(self._metadata.bootstrap, quota_pb2_grpc.QuotasStub)

    def alter_quotas(self, quotas: Mapping[QuotaKey, Limits]) -> int:
        """Replace each entity's limits (``Limits()``: remove them). Returns the quota version after;
        brokers and dispatchers apply it within moments (one long poll)."""
        if not quotas:
            raise InvalidArgument("no quotas given")
        request = quota_pb2.AlterQuotasRequest(quotas=[quota_to_proto(k, v) for k, v in quotas.items()])
        # Idempotent (a replace): retried while the coordinator is unreachable or changing leaders.
        resp = call_with_retry(
            lambda: call(self._quotas().AlterQuotas, request, self._timeout), self._timeout
        )
        return int(resp.version)

    def delete_quotas(self, entities: Iterable[QuotaKey]) -> int:
        """Remove every limit of ``entities``; returns how many had any."""
        keys = list(entities)
        if not keys:
            raise InvalidArgument("no quota entities given")
        request = quota_pb2.DeleteQuotasRequest(
            entities=[quota_pb2.QuotaEntity(kind=k.kind.value, name=k.name) for k in keys]
        )
        resp = call_with_retry(
            lambda: call(self._quotas().DeleteQuotas, request, self._timeout), self._timeout
        )
        return int(resp.deleted)

    def describe_quotas(self, kind: Kind | None = None) -> dict[QuotaKey, Limits]:
        """Every quota (of ``kind`` only, if given)."""
        request = quota_pb2.DescribeQuotasRequest(kind=kind.value if kind is not None else "")
        resp = call_with_retry(
            lambda: call(self._quotas().DescribeQuotas, request, self._timeout), self._timeout
        )
        return {entity_from_proto(q.entity): limits_from_proto(q.limits) for q in resp.quotas}
