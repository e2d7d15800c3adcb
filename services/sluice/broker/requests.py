"""The broker core's request and answer types: domain objects, no protobuf.

The transport adapters (``handlers``, used by the gRPC servicer and the wire connections)
translate protobuf to these and back; the core (``service``) takes and returns only these,
and checks them (``check_continuous`` here, the rest in ``service`` and ``fetch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sluice.broker.fetch import FetchLimits, PartitionRead, PartitionSpec, TopicPartitionKey
from sluice.errors import InvalidRequest, SluiceError
from sluice.security.context import ANONYMOUS, GRPC, RequestContext

__all__ = [
    "CONSUMER_REPLICA_ID",
    "DEFAULT_CONTEXT",
    "EpochAnswer",
    "EpochQuery",
    "FetchOutcome",
    "FetchParams",
    "FollowFrom",
    "OffsetAnswer",
    "OffsetQuery",
    "ProduceItem",
    "ProduceResult",
    "check_continuous",
]

#: ``FetchParams.replica_id`` of a consumer's fetch (Kafka's ``-1``). A follower broker's fetch is
#: the same Fetch with its own id (docs/replication.md, "The data path").
CONSUMER_REPLICA_ID = -1


@dataclass(frozen=True, slots=True)
class ProduceItem:
    topic: str
    partition: int
    records: bytes


@dataclass(slots=True)
class ProduceResult:
    topic: str
    partition: int
    error: SluiceError | None = None
    base_offset: int = -1
    append_time_ms: int = -1
    log_start_offset: int = -1
    #: acks=all on a replicated partition: the answer waits until the HW passes this offset (the
    #: batch's last); -1: nothing to wait for (docs/replication.md, "acks=all").
    commit_offset: int = -1


@dataclass(frozen=True, slots=True)
class FetchParams:
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    partitions: Sequence[PartitionSpec]
    session_id: int = 0
    session_epoch: int = -1
    forgotten: Sequence[TopicPartitionKey] = ()
    #: Go on answering from each answer's next offsets (wire protocol only, ``docs/wire.md``).
    continuous: bool = False
    replica_id: int = CONSUMER_REPLICA_ID
    #: A follower's positions were recorded when its frame was read (``ReplicaSteps.replica_positions``).
    positions_recorded: bool = False


@dataclass(frozen=True, slots=True)
class FollowFrom:
    """Where a continuous fetch goes on after its first answer: the partitions at their next
    offsets, with the limits already validated."""

    specs: list[PartitionSpec]
    limits: FetchLimits
    #: A follower's continuous replica fetch: its broker id (its rounds read to the log end).
    replica_id: int = CONSUMER_REPLICA_ID


@dataclass(slots=True)
class FetchOutcome:
    session_id: int
    partitions: list[PartitionRead] = field(default_factory=list)
    #: A request-level error (fetch session problems); partitions is then empty.
    error: SluiceError | None = None
    #: A continuous fetch whose answer had no error: how to follow it.
    follow: FollowFrom | None = None
    #: A follow's round that holds only the partitions with something new since the previous
    #: answer; the others are as that answer said (the adapter sends them again as they were).
    delta: bool = False
    #: Bytes this answer holds in the fetch memory pool (``memory.py``): the transport releases
    #: them once the answer is handed to the socket (``release_fetch``).
    held_bytes: int = 0


#: What a caller that names no context is: an in-process caller (tests, tools) seen as an
#: anonymous gRPC client, which is what the servicer passes today.
DEFAULT_CONTEXT = RequestContext(ANONYMOUS, GRPC)


@dataclass(frozen=True, slots=True)
class OffsetQuery:
    topic: str
    partition: int
    #: -2 earliest, -1 latest, >= 0 a timestamp in ms.
    timestamp: int


@dataclass(slots=True)
class OffsetAnswer:
    topic: str
    partition: int
    error: SluiceError | None = None
    offset: int = -1
    timestamp: int = -1


@dataclass(frozen=True, slots=True)
class EpochQuery:
    """OffsetForLeaderEpoch for one partition: where does ``leader_epoch`` end in the leader's log?"""

    topic: str
    partition: int
    leader_epoch: int
    #: The epoch the asker believes current (-1: not checked).
    current_leader_epoch: int = -1


@dataclass(slots=True)
class EpochAnswer:
    topic: str
    partition: int
    error: SluiceError | None = None
    #: The largest epoch at or below the asked one (-1: none) and where it ends.
    leader_epoch: int = -1
    end_offset: int = -1


def check_continuous(params: FetchParams, ctx: RequestContext) -> None:
    """Refuse a ``continuous`` fetch where it cannot be served: on a transport that answers
    once per request (gRPC), or with a fetch session (the broker advances the offsets itself)."""
    if not params.continuous:
        return
    if not ctx.transport.follows:
        raise InvalidRequest(
            "FetchRequest.continuous exists only on the wire protocol (docs/wire.md); "
            "over gRPC, send the next fetch after each answer"
        )
    if params.session_epoch != -1:
        raise InvalidRequest("a continuous fetch is sessionless: set session_epoch to -1")
    if params.max_wait_ms <= 0:
        # It would answer again at once, forever: a busy loop on both sides.
        raise InvalidRequest("a continuous fetch needs max_wait_ms > 0")
