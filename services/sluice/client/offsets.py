"""ListOffsets: earliest, latest or by-timestamp offsets of a topic's partitions."""

from __future__ import annotations

import time
from collections.abc import Iterable

from sluice.client.metadata import MetadataCache
from sluice.client.rpc import ChannelPool, call
from sluice.errors import (
    BrokerNotAvailable,
    InvalidArgument,
    NotLeader,
    RequestTimedOut,
    SluiceError,
    UnknownTopicOrPartition,
    error_from_proto,
)
from sluice.v1 import broker_pb2, broker_pb2_grpc

__all__ = ["EARLIEST", "LATEST", "OffsetSpec", "list_offsets", "spec_to_timestamp"]

EARLIEST = -2
LATEST = -1
#: "earliest", "latest" or a timestamp in ms.
OffsetSpec = str | int


def spec_to_timestamp(spec: OffsetSpec) -> int:
    """'earliest' -> -2, 'latest' -> -1, a timestamp in ms (>= 0) -> itself."""
    if spec == "earliest":
        return EARLIEST
    if spec == "latest":
        return LATEST
    if isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
        return spec
    raise InvalidArgument(f"offset spec must be 'earliest', 'latest' or a timestamp in ms >= 0, got {spec!r}")


# Routing errors that a metadata refresh and another try can fix.
_ROUTING = (NotLeader, BrokerNotAvailable, UnknownTopicOrPartition)


# Over the complexity limit when it was set (pyproject.toml): next to split.
def list_offsets(  # noqa: C901
    channels: ChannelPool,
    metadata: MetadataCache,
    topic: str,
    spec: OffsetSpec = "earliest",
    *,
    partitions: Iterable[int] | None = None,
    timeout: float = 30.0,
) -> dict[int, int]:
    """``{partition: offset}`` for ``spec``; one ListOffsets request per broker.

    By timestamp, the offset is the first record whose timestamp is >= ``spec``
    (the high watermark if there is none). Routing errors refresh the metadata
    and retry until ``timeout``; other errors raise.
    """
    ts = spec_to_timestamp(spec)
    md = metadata.get([topic])
    count = md.partition_count(topic)
    wanted = list(range(count)) if partitions is None else sorted(set(partitions))
    for p in wanted:
        if not 0 <= p < count:
            raise UnknownTopicOrPartition(f"topic {topic!r} has no partition {p} (it has {count})")
    result: dict[int, int] = {}
    deadline = time.monotonic() + timeout
    backoff = 0.05
    while True:
        pending = [p for p in wanted if p not in result]
        by_broker: dict[str | None, list[int]] = {}
        for p in pending:
            by_broker.setdefault(md.leader_address(topic, p), []).append(p)
        retry: SluiceError | None = None
        for address, parts in by_broker.items():
            if address is None:
                retry = BrokerNotAvailable(f"no live broker hosts {topic!r} partitions {parts}")
                continue
            request = broker_pb2.ListOffsetsRequest(
                partitions=[
                    broker_pb2.ListOffsetsPartition(topic=topic, partition=p, timestamp=ts) for p in parts
                ]
            )
            try:
                resp = call(channels.stub(address, broker_pb2_grpc.BrokerStub).ListOffsets, request, timeout)
            except _ROUTING as exc:
                retry = exc
                continue
            for r in resp.partitions:
                err = error_from_proto(r.error)
                if err is not None:
                    if isinstance(err, _ROUTING):
                        retry = err
                        continue
                    raise err
                if r.topic == topic and r.partition in parts:
                    result[r.partition] = r.offset
        if all(p in result for p in wanted):
            return {p: result[p] for p in wanted}
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if retry is not None:
                raise RequestTimedOut(f"list_offsets({topic!r}) gave up after {timeout:g} s: {retry}")
            raise SluiceError(f"broker answered ListOffsets without partitions {pending}")
        # A backoff before asking the coordinator where the partitions went.
        time.sleep(min(backoff, remaining))
        backoff = min(backoff * 2, 1.0)
        md = metadata.get([topic], refresh=True)
        if topic in md.unknown_topics:
            raise UnknownTopicOrPartition(f"topic {topic!r} does not exist")
