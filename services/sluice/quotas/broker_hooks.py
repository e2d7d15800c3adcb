"""What a broker request counts against its caller's quotas (the broker's hooks call these)."""

from __future__ import annotations

from sluice.quotas.model import Resource
from sluice.v1 import broker_pb2

__all__ = ["fetch_amounts", "is_replica", "produce_amounts"]


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
