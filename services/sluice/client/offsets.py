"""ListOffsets: earliest, latest or by-timestamp offsets of a topic's partitions.

The SDK's face of the peer layer's one planner (``sluice.common.list_offsets``): this module turns an
offset spec into a timestamp, checks the partitions against the metadata, and raises what is left.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.client.metadata import ClusterMetadata, MetadataCache
from sluice.common import list_offsets as planner
from sluice.common.peers import Peers, RefreshGate, is_routing
from sluice.errors import InvalidArgument, RequestTimedOut, UnknownTopicOrPartition

__all__ = ["EARLIEST", "LATEST", "LOG_END", "OffsetSpec", "list_offsets", "spec_to_timestamp"]

EARLIEST = planner.EARLIEST
LATEST = planner.LATEST
LOG_END = planner.LOG_END
#: "earliest", "latest", "log_end" or a timestamp in ms.
OffsetSpec = str | int


def spec_to_timestamp(spec: OffsetSpec) -> int:
    """'earliest' -> -2, 'latest' -> -1, a timestamp in ms (>= 0) -> itself."""
    if spec == "earliest":
        return EARLIEST
    if spec == "latest":
        return LATEST
    if spec == "log_end":
        return LOG_END
    if isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
        return spec
    raise InvalidArgument(
        f"offset spec must be 'earliest', 'latest', 'log_end' or a timestamp in ms >= 0, got {spec!r}"
    )


def list_offsets(
    channels: Peers,
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
    view = _TopicView(metadata, topic)
    wanted = _wanted(view.md, topic, partitions)
    answer = planner.list_offsets_blocking(
        channels,
        [(topic, p) for p in wanted],
        ts,
        view.leader_of,
        bound=planner.RetryBound(timeout),
        rpc_timeout=timeout,
        gate=RefreshGate(view.refresh),
    )
    error = answer.first_error()
    if error is None:
        return {p: answer.offsets[(topic, p)] for p in wanted}
    if is_routing(error):
        raise RequestTimedOut(f"list_offsets({topic!r}) gave up after {timeout:g} s: {error}")
    raise error


def _wanted(md: ClusterMetadata, topic: str, partitions: Iterable[int] | None) -> list[int]:
    count = md.partition_count(topic)
    wanted = list(range(count)) if partitions is None else sorted(set(partitions))
    for p in wanted:
        if not 0 <= p < count:
            raise UnknownTopicOrPartition(f"topic {topic!r} has no partition {p} (it has {count})")
    return wanted


class _TopicView:
    """The metadata one call routes by; ``refresh`` asks the coordinator where the partitions went."""

    def __init__(self, metadata: MetadataCache, topic: str) -> None:
        self._metadata = metadata
        self._topic = topic
        self.md = metadata.get([topic])

    def leader_of(self, topic: str, partition: int) -> str | None:
        return self.md.leader_address(topic, partition)

    def refresh(self) -> None:
        md = self._metadata.get([self._topic], refresh=True)
        if self._topic in md.unknown_topics:
            raise UnknownTopicOrPartition(f"topic {self._topic!r} does not exist")
        self.md = md
