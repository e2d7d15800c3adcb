"""What a broker request counts against its caller's quotas (the broker's hooks call these)."""

from __future__ import annotations

import dataclasses

from sluice.quotas.model import MAX_NAME, Resource
from sluice.security.context import RequestContext
from sluice.v1 import broker_pb2

__all__ = ["CLIENT_ID_METADATA", "fetch_amounts", "is_replica", "produce_amounts", "with_client_id"]

#: The gRPC metadata key a client announces its client id with (the wire hello's ``client_id``).
CLIENT_ID_METADATA = "sluice-client-id"


def with_client_id(ctx: RequestContext, grpc_context: object) -> RequestContext:
    """``ctx`` with the client id a gRPC call announces in its metadata (quotas key anonymous callers
    by it); ``ctx`` itself when it announces none."""
    metadata = getattr(grpc_context, "invocation_metadata", None)
    if metadata is None or ctx.client_id:
        return ctx
    for key, value in metadata() or ():
        if key == CLIENT_ID_METADATA and isinstance(value, str) and value:
            return dataclasses.replace(ctx, client_id=value[:MAX_NAME])
    return ctx


def produce_amounts(request: broker_pb2.ProduceRequest) -> list[tuple[Resource, float]]:
    """A produce: its record bytes, and one request."""
    size = sum(len(p.records) for p in request.partitions)
    return [(Resource.PRODUCE_BYTES, float(size)), (Resource.REQUESTS, 1.0)]


def fetch_amounts(answer: broker_pb2.FetchResponse) -> list[tuple[Resource, float]]:
    """A fetch: the record bytes of its answer, and one request."""
    size = sum(len(p.records) for p in answer.partitions)
    return [(Resource.FETCH_BYTES, float(size)), (Resource.REQUESTS, 1.0)]


def is_replica(request: broker_pb2.FetchRequest) -> bool:
    """A follower's fetch: replication is the cluster's own traffic (its throttle is
    ``replica_throttle``), never a client's quota."""
    return request.HasField("replica_id") and request.replica_id >= 0
