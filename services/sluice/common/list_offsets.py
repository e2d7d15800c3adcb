"""The one ListOffsets planner: partitions grouped by leader, one request per broker, answers merged.

Every caller that asks brokers for offsets comes here: the SDK (``Client.list_offsets``, auto offset
reset, commits; so also the Spark source and the CLI), the dispatcher (initial positions, log ends, the
log start after OFFSET_OUT_OF_RANGE), the offset store (ResetOffsets to earliest/latest/a time) and the
coordinator (lag). No other module calls a ListOffsets stub (a test checks it).

One call runs in rounds. A round groups the partitions still unanswered by their leader (``leader_of``,
which reads the caller's current metadata), sends one request per broker (concurrently for the async
driver) and merges the answers into an :class:`OffsetsAnswer`. Routing errors (``peers.ROUTING_ERRORS``,
including "no live leader known") refresh the metadata through the caller's gate, once per round, and the
round repeats for those partitions only, after the peer backoff, within a :class:`RetryBound`; any other
error ends the call at once. Errors are typed: per partition through ``sluice.errors.error_from_proto``,
per call through ``sluice.common.rpc.error_from_rpc``. The caller decides what an error left in the
answer means (the SDK raises it; lag leaves the partition's lag unknown).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc

from sluice.common.backoff import Backoff
from sluice.common.peers import AioPeers, AioRefreshGate, Peers, RefreshGate, is_routing
from sluice.common.rpc import error_from_rpc
from sluice.errors import BrokerNotAvailable, SluiceError, error_from_proto
from sluice.v1 import broker_pb2, broker_pb2_grpc

__all__ = [
    "EARLIEST",
    "LATEST",
    "LOG_END",
    "OFFLOAD_MIN",
    "LeaderOf",
    "ListOffsetsPlan",
    "OffsetsAnswer",
    "RetryBound",
    "TopicPartition",
    "list_offsets",
    "list_offsets_blocking",
    "merge",
    "plan",
]

#: ListOffsets' sentinel timestamps (broker.proto). LATEST is the high watermark (what consumers may
#: read); LOG_END the leader's log end offset, above it while followers catch up (``topic describe``).
EARLIEST = -2
LATEST = -1
LOG_END = -3

TopicPartition = tuple[str, int]
#: The gRPC address of the live broker leading ``(topic, partition)``, or None when none is known.
#: Must read a snapshot: the async driver may call it from a worker thread (see ``OFFLOAD_MIN``).
LeaderOf = Callable[[str, int], str | None]

#: From this many partitions on, the async driver plans and merges in a worker thread: thousands of
#: partitions cost tens of milliseconds of request building and answer parsing, and the event loop has
#: heartbeats to answer meanwhile.
OFFLOAD_MIN = 512


@dataclass(frozen=True)
class RetryBound:
    """How long one call keeps retrying routing errors: ``seconds`` and ``rounds``, whichever ends first.

    ``rounds=1`` is a single round: no refresh, no retry.
    """

    seconds: float
    rounds: int = 32


@dataclass
class ListOffsetsPlan:
    """One round: a request per broker address, and the partitions no live broker leads."""

    requests: dict[str, broker_pb2.ListOffsetsRequest] = field(default_factory=dict)
    unroutable: list[TopicPartition] = field(default_factory=list)


@dataclass
class OffsetsAnswer:
    """What one call found: the offsets, and a typed error for each partition left without one."""

    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    errors: dict[TopicPartition, SluiceError] = field(default_factory=dict)

    def first_error(self) -> SluiceError | None:
        """The error to raise for the whole call: a non-routing one first (it is the caller's to fix)."""
        fatal = [e for e in self.errors.values() if not is_routing(e)]
        if fatal:
            return fatal[0]
        return next(iter(self.errors.values()), None)


def plan(wanted: Iterable[TopicPartition], timestamp: int, leader_of: LeaderOf) -> ListOffsetsPlan:
    """Group ``wanted`` by leader: one ``ListOffsetsRequest`` per broker address, in ``wanted`` order."""
    out = ListOffsetsPlan()
    for topic, partition in wanted:
        address = leader_of(topic, partition)
        if address is None:
            out.unroutable.append((topic, partition))
            continue
        request = out.requests.get(address)
        if request is None:
            request = out.requests[address] = broker_pb2.ListOffsetsRequest()
        request.partitions.add(topic=topic, partition=partition, timestamp=timestamp)
    return out


Reply = broker_pb2.ListOffsetsResponse | SluiceError


def merge(round_plan: ListOffsetsPlan, replies: Iterable[tuple[str, Reply]]) -> OffsetsAnswer:
    """One round's answers (a response, or the typed error of the call, per address) as one answer.

    A partition a broker was asked for and left out of its response gets an error too: no partition
    asked for comes back without an offset or an error.
    """
    answer = OffsetsAnswer()
    for tp in round_plan.unroutable:
        answer.errors[tp] = BrokerNotAvailable(f"no live broker leads {tp[0]}/{tp[1]}")
    for address, reply in replies:
        asked = {(p.topic, p.partition) for p in round_plan.requests[address].partitions}
        if isinstance(reply, SluiceError):
            for tp in asked:
                answer.errors[tp] = reply
            continue
        for item in reply.partitions:
            tp = (item.topic, item.partition)
            if tp not in asked:
                continue  # not ours to take: only what this broker was asked for
            error = error_from_proto(item.error)
            if error is not None:
                answer.errors[tp] = error
            else:
                answer.offsets[tp] = item.offset
        for tp in sorted(asked):
            if tp not in answer.offsets and tp not in answer.errors:
                answer.errors[tp] = SluiceError(
                    f"broker {address} answered ListOffsets without {tp[0]}/{tp[1]}"
                )
    return answer


class _Rounds:
    """The retry rule both drivers follow; the drivers only do the I/O."""

    def __init__(self, wanted: Iterable[TopicPartition], bound: RetryBound, gated: bool) -> None:
        self.pending = list(dict.fromkeys(wanted))  # unique, in the caller's order
        self.result = OffsetsAnswer()
        self.rounds = 0
        self.backoff = Backoff()
        self._bound = bound
        self._gated = gated
        self._deadline = time.monotonic() + bound.seconds

    def take(self, answer: OffsetsAnswer) -> float | None:
        """Fold one round in; the wait before the next round, or None when the call is over."""
        self.rounds += 1
        self.result.offsets.update(answer.offsets)
        self.result.errors = answer.errors
        self.pending = list(answer.errors)
        if not answer.errors or not self._gated or self.rounds >= self._bound.rounds:
            return None
        if any(not is_routing(e) for e in answer.errors.values()):
            return None  # the caller's to fix: retrying cannot help
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            return None
        return min(self.backoff.next(), remaining)


def list_offsets_blocking(
    peers: Peers,
    wanted: Iterable[TopicPartition],
    timestamp: int,
    leader_of: LeaderOf,
    *,
    bound: RetryBound,
    rpc_timeout: float,
    gate: RefreshGate | None = None,
) -> OffsetsAnswer:
    """The planner for blocking callers (the SDK): brokers are asked one after the other."""
    rounds = _Rounds(wanted, bound, gate is not None)
    while True:
        seen = gate.generation if gate is not None else 0
        round_plan = plan(rounds.pending, timestamp, leader_of)
        replies: list[tuple[str, Reply]] = []
        for address, request in round_plan.requests.items():
            stub = peers.stub(address, broker_pb2_grpc.BrokerStub)
            try:
                replies.append((address, stub.ListOffsets(request, timeout=rpc_timeout)))
            except grpc.RpcError as exc:
                replies.append((address, error_from_rpc(exc)))
        wait = rounds.take(merge(round_plan, replies))
        if wait is None:
            return rounds.result
        # A backoff, not a poll: nothing to wait on while the partitions move.
        time.sleep(wait)
        assert gate is not None
        gate.refresh_after(seen)


async def list_offsets(
    peers: AioPeers,
    wanted: Iterable[TopicPartition],
    timestamp: int,
    leader_of: LeaderOf,
    *,
    bound: RetryBound,
    rpc_timeout: float,
    gate: AioRefreshGate | None = None,
) -> OffsetsAnswer:
    """The planner for a service's event loop: one request per broker, all brokers at once."""
    rounds = _Rounds(wanted, bound, gate is not None)
    while True:
        seen = gate.generation if gate is not None else 0
        offload = len(rounds.pending) >= OFFLOAD_MIN
        if offload:
            round_plan = await asyncio.to_thread(plan, rounds.pending, timestamp, leader_of)
        else:
            round_plan = plan(rounds.pending, timestamp, leader_of)
        addresses = list(round_plan.requests)
        answers = await asyncio.gather(
            *(_ask(peers, a, round_plan.requests[a], rpc_timeout) for a in addresses)
        )
        replies = list(zip(addresses, answers, strict=True))
        if offload:
            answer = await asyncio.to_thread(merge, round_plan, replies)
        else:
            answer = merge(round_plan, replies)
        wait = rounds.take(answer)
        if wait is None:
            return rounds.result
        await asyncio.sleep(wait)
        assert gate is not None
        await gate.refresh_after(seen)


async def _ask(
    peers: AioPeers, address: str, request: broker_pb2.ListOffsetsRequest, rpc_timeout: float
) -> Reply:
    stub = peers.broker(address)
    try:
        response: broker_pb2.ListOffsetsResponse = await stub.ListOffsets(request, timeout=rpc_timeout)
    except grpc.RpcError as exc:
        return error_from_rpc(exc)
    return response
