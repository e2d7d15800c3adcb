"""The fetcher's state and its pure helpers (``fetcher.py`` drives them).

Per broker (``BrokerState``): the fetch session, the request in flight, a followed fetch's
read positions, backoff. Per partition (``PartitionState``): the position, backoff, paused.
Plus the argument checks, the retry backoff, the request encoder and the placement of
partitions on their leaders after a metadata refresh.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from sluice.client.fetch_session import FetchSession, PartitionFetchState, SessionRequest
from sluice.client.links import BrokerLink
from sluice.client.metadata import ClusterMetadata
from sluice.client.rpc import MAX_MESSAGE_BYTES
from sluice.client.stages import stage
from sluice.codec.batch import iter_headers
from sluice.common.names import validate_topic
from sluice.errors import InvalidArgument, OffsetOutOfRange, SluiceError, UnknownTopicOrPartition
from sluice.v1 import broker_pb2, common_pb2

__all__ = [
    "AutoOffsetReset",
    "BrokerState",
    "PartitionState",
    "RawChunk",
    "TopicPartition",
    "backoff",
    "check_int",
    "check_limits",
    "check_offset",
    "check_tp",
    "decoding",
    "earliest",
    "end_of",
    "fetch_request",
    "gc_paused",
    "place",
    "wanted_by_broker",
]

TopicPartition = tuple[str, int]
AutoOffsetReset = Literal["earliest", "latest", "none"]

MAX_WAIT_CAP_MS = 60_000
# Room for the protobuf envelope of a response.
_RESPONSE_OVERHEAD = 1024 * 1024
RETRY_BACKOFF = 0.1
RETRY_BACKOFF_MAX = 2.0


class RawChunk(NamedTuple):
    """Encoded batches of one partition from one fetch; records below ``start`` are old."""

    topic: str
    partition: int
    start: int
    data: bytes
    #: The leader epoch the fetch was made in (KIP-320; -1: unknown): what a commit of them carries.
    leader_epoch: int = -1


@dataclass
class BrokerState:
    """The fetcher's state for one broker address."""

    address: str
    session: FetchSession
    in_flight: SessionRequest | None = None
    backoff_until: float = 0.0
    failures: int = 0
    stream: BrokerLink | None = None
    #: While following: where the broker reads each partition next (it moves with each answer).
    follow: dict[TopicPartition, PartitionFetchState] | None = None


@dataclass
class PartitionState:
    """The fetcher's state for one partition."""

    position: int
    #: Not fetched until this time (after a retriable error).
    backoff_until: float = 0.0
    #: Paused after a fatal error until seek().
    paused: bool = False
    failures: int = 0
    #: The leader epoch from the last Metadata (-1: not known yet); every fetch carries it (KIP-320).
    leader_epoch: int = -1
    #: The epoch ``leader_epoch`` had when records were last fetched (-1: none fetched yet): after a
    #: leader change, the new leader is asked where that epoch ends (truncation detection).
    fetched_epoch: int = -1
    #: Set when the leader epoch changed after records were fetched: the position is checked with
    #: OffsetForLeaderEpoch (``fetch_validate``) before the partition is fetched again.
    validate: bool = False
    #: The high watermark the last answer for this partition carried (-1: none yet): ``highwater()``.
    high_watermark: int = -1

    def seek(self, position: int, leader_epoch: int) -> None:
        """Fetch from ``position`` next; ``leader_epoch`` is the epoch the records before it were fetched
        under (a committed one), or -1: a position chosen by the user, not checked."""
        self.position = position
        self.paused = False
        self.backoff_until = 0.0
        self.fetched_epoch = leader_epoch
        self.validate = 0 <= leader_epoch < self.leader_epoch

    def fetch_state(self, max_bytes: int, filter_expr: str) -> PartitionFetchState:
        """What the next fetch of this partition sends."""
        return PartitionFetchState(self.position, max_bytes, filter_expr, self.leader_epoch)


def fetch_request(
    req: SessionRequest,
    continuous: bool,
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    client_id: str,
) -> broker_pb2.FetchRequest:
    """The FetchRequest of a session request (``continuous``: a followed fetch)."""
    return broker_pb2.FetchRequest(
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        session_id=req.session_id,
        session_epoch=req.session_epoch,
        partitions=[
            broker_pb2.FetchPartition(
                topic=tp[0],
                partition=tp[1],
                fetch_offset=st.fetch_offset,
                partition_max_bytes=st.max_bytes,
                filter=st.filter,
                current_leader_epoch=st.leader_epoch if st.leader_epoch >= 0 else None,
            )
            for tp, st in req.partitions.items()
        ],
        forgotten=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in req.forgotten],
        client_id=client_id,
        continuous=continuous,
    )


def place(
    md: ClusterMetadata,
    parts: dict[TopicPartition, PartitionState],
    leaders: dict[TopicPartition, str | None],
    errors: list[SluiceError],
) -> bool:
    """Record each partition's leader and leader epoch from ``md``; pause (with an error in ``errors``)
    the partitions of a topic that does not exist or beyond the topic's partition count. True when a
    partition's position must be validated (``fetch_validate``) before it is fetched again."""
    validate = False
    for tp, st in parts.items():
        topic, partition = tp
        if topic in md.unknown_topics and not st.paused:
            st.paused = True
            errors.append(
                UnknownTopicOrPartition(f"topic {topic!r} does not exist", topic=topic, partition=partition)
            )
            continue
        t = md.topics.get(topic)
        if t is not None and not 0 <= partition < len(t.partitions) and not st.paused:
            st.paused = True
            errors.append(
                UnknownTopicOrPartition(
                    f"topic {topic!r} has no partition {partition} (it has {len(t.partitions)})",
                    topic=topic,
                    partition=partition,
                )
            )
            continue
        leaders[tp] = md.leader_address(topic, partition)
        epoch = md.leader_epoch(topic, partition)
        if epoch != st.leader_epoch:
            # A new leader (or the first metadata): validate the position if records were fetched
            # under an older epoch (KIP-320 truncation detection, fetch_validate).
            st.validate = st.validate or (0 <= st.fetched_epoch < epoch)
            st.leader_epoch = epoch
        validate = validate or (st.validate and not st.paused)
    return validate


def wanted_by_broker(
    parts: Mapping[TopicPartition, PartitionState],
    leaders: Mapping[TopicPartition, str | None],
    filters: Mapping[str, str],
    partition_max_bytes: int,
    now: float,
) -> tuple[dict[str, dict[TopicPartition, PartitionFetchState]], float | None, bool]:
    """The partitions to fetch now, by leader address; when the earliest of the others (in backoff,
    or with no known leader) may be fetched; and whether a partition has no known leader (the
    metadata needs a refresh)."""
    wanted: dict[str, dict[TopicPartition, PartitionFetchState]] = {}
    next_at: float | None = None
    unplaced = False
    for tp, st in parts.items():
        if st.paused or st.validate:
            continue
        if st.backoff_until > now:
            next_at = earliest(next_at, st.backoff_until)
            continue
        address = leaders.get(tp)
        if address is None:
            unplaced = True
            next_at = earliest(next_at, now + RETRY_BACKOFF)
            continue
        wanted.setdefault(address, {})[tp] = st.fetch_state(partition_max_bytes, filters.get(tp[0], ""))
    return wanted, next_at, unplaced


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while a response's records are created.

    Tens of thousands of new Records that all survive would otherwise trigger
    repeated collections (including full ones, as they are promoted to the old
    generation) that scan the whole heap: measured, that doubles the cost of
    decoding. Records hold no cycles, so nothing is lost by collecting later.
    The previous state is restored, so a program that disabled GC keeps it off.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def decoding() -> Iterator[None]:
    """Decode a fetch's batches: the GC paused (``gc_paused``), and the time taken observed as the
    ``fetch_decode`` stage (client/stages.py), once per fetch."""
    with gc_paused(), stage("fetch_decode").timed():
        yield


def earliest(current: float | None, candidate: float) -> float:
    """The earlier of two deadlines (None: none yet)."""
    return candidate if current is None else min(current, candidate)


def backoff(failures: int) -> float:
    return float(min(RETRY_BACKOFF * 2 ** (failures - 1), RETRY_BACKOFF_MAX))


def end_of(data: bytes, fallback: int) -> int:
    """The offset after the last whole batch in ``data`` (if the broker left next_offset unset)."""
    end = fallback
    for _, h in iter_headers(data):
        end = max(end, h.next_offset)
    return end


def check_limits(
    max_wait_ms: int, min_bytes: int, max_bytes: int, partition_max_bytes: int, auto_offset_reset: str
) -> None:
    """The fetcher's settings, checked before anything starts."""
    check_int("max_wait_ms", max_wait_ms, 0, MAX_WAIT_CAP_MS)
    check_int("min_bytes", min_bytes, 0, MAX_MESSAGE_BYTES)
    check_int("max_bytes", max_bytes, 1, MAX_MESSAGE_BYTES - _RESPONSE_OVERHEAD)
    check_int("partition_max_bytes", partition_max_bytes, 1, MAX_MESSAGE_BYTES - _RESPONSE_OVERHEAD)
    if auto_offset_reset not in ("earliest", "latest", "none"):
        raise InvalidArgument(
            f"auto_offset_reset must be earliest, latest or none, got {auto_offset_reset!r}"
        )


def check_int(name: str, value: int, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgument(f"{name} must be an integer from {lo} to {hi}, got {value!r}")


def check_tp(tp: Any) -> TopicPartition:
    if not (isinstance(tp, tuple) and len(tp) == 2 and isinstance(tp[1], int)):
        raise InvalidArgument(f"a partition is a (topic, partition) tuple, got {tp!r}")
    validate_topic(tp[0])
    if tp[1] < 0:
        raise UnknownTopicOrPartition(f"partition {tp[1]} of {tp[0]!r} is negative")
    return (tp[0], tp[1])


def check_offset(tp: TopicPartition, offset: Any) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise OffsetOutOfRange(f"{tp[0]}[{tp[1]}]: offset must be an integer >= 0, got {offset!r}")
    return offset
