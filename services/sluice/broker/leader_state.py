"""A replicated partition's state on its leader: follower positions, the high watermark, acks=all waits.

docs/replication.md, "The data path". One :class:`LeaderState` per partition this broker leads with more
than one replica (a one-replica partition has none: its high watermark is its log end, as before
replication, and nothing here runs for it).

- **Positions.** A follower's fetch offset is its log end offset (LEO), as in Kafka: it asks for what it
  does not have yet. It also reports the offset below which it has fsync'ed (``flushed``). Recorded by
  :meth:`record_fetch`, once per fetch request (never per round of a continuous fetch: a round's offsets
  are what the leader *sent*, not what the follower holds).
- **High watermark** (:meth:`advance`): the smallest LEO over the ISR, the leader's own included; under
  ``flush=always`` also at most the ``min_insync_replicas``-th highest flushed offset among the ISR, so
  the HW moves only over what that many replicas have on disk. Strict min ISR (KIP-966): it does not
  move while the ISR is smaller than ``min_insync_replicas``. It never goes down. LEOs and flushed
  offsets are batch boundaries, so the HW is one too.
- **acks=all waits** (:meth:`wait_committed`): one heap per partition keyed by the batch's last offset,
  popped when the HW passes it. No polling: only an advance wakes a waiter.
- **The consumers' view** (:class:`HighWatermarkView`): what consumer fetches and ListOffsets read, the
  log bounded by the HW.

Event-loop thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sluice.broker.fetch import ReadChunk, TopicPartitionKey
from sluice.broker.log.partition_log import PartitionLog
from sluice.broker.log.results import ReadResult
from sluice.broker.requests import ProduceResult
from sluice.codec.batch.layout import read_header
from sluice.errors import NotEnoughReplicas, NotLeader, RequestTimedOut, SluiceError

__all__ = [
    "FollowerPosition",
    "HighWatermarkView",
    "LeaderState",
    "check_enough_replicas",
    "wait_committed",
]

_ids = itertools.count()


@dataclass(slots=True)
class FollowerPosition:
    """What the leader knows of one follower."""

    #: Its log end offset, from its last fetch (-1: it has not fetched in this leadership).
    leo: int = -1
    #: The offset below which it has fsync'ed (-1: unknown).
    flushed: int = -1
    #: The last time (ms, the leader's monotonic clock) its LEO reached the leader's LEO.
    caught_up_ms: int = 0
    #: The leader's LEO and the time at its previous fetch: reaching that LEO now means it was caught up
    #: then (Kafka's rule: under steady appends a follower is never exactly at the live log end).
    last_fetch_leo: int = -1
    last_fetch_ms: int = 0
    #: Its latest fetch reached the HW while outside the ISR: it may rejoin (checked once).
    may_rejoin: bool = False


@dataclass(slots=True)
class LeaderState:
    """One led, replicated partition. Caller: ``leading.Leaders``."""

    key: TopicPartitionKey
    log: PartitionLog
    broker_id: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_insync_replicas: int
    leader_epoch: int
    partition_epoch: int
    #: flush=always: the HW also waits for min ISR replicas' fsyncs.
    flush_always: bool
    hw: int = 0
    #: The topic incarnation (the HW checkpoint is kept per incarnation).
    topic_id: str = ""
    followers: dict[int, FollowerPosition] = field(default_factory=dict)
    #: (last offset, tie-breaker, future) of produces waiting for the HW to pass them.
    _waits: list[tuple[int, int, asyncio.Future[None]]] = field(default_factory=list)
    #: Called after the HW moved (wakes consumers' parked reads).
    on_advance: Callable[[TopicPartitionKey], None] | None = None

    def __post_init__(self) -> None:
        self.hw = max(min(self.hw, self.log.log_end_offset), self.log.log_start_offset)

    def reassign(
        self,
        replicas: tuple[int, ...],
        isr: tuple[int, ...],
        min_insync_replicas: int,
        leader_epoch: int,
        partition_epoch: int,
        now_ms: int,
    ) -> None:
        """The controller's newer state. A new leader epoch forgets the followers' positions (they
        truncate and fetch again in it); a follower new to the replicas starts as just caught up."""
        if leader_epoch != self.leader_epoch:
            self.followers.clear()
        self.replicas, self.isr = replicas, isr
        self.min_insync_replicas = min_insync_replicas
        self.leader_epoch, self.partition_epoch = leader_epoch, partition_epoch
        for replica in replicas:
            if replica != self.broker_id and replica not in self.followers:
                self.followers[replica] = FollowerPosition(caught_up_ms=now_ms)
        for gone in [r for r in self.followers if r not in replicas]:
            del self.followers[gone]
        self.advance()

    # ---- positions and the high watermark ------------------------------------------------

    def record_fetch(self, replica: int, leo: int, flushed: int, now_ms: int) -> None:
        """A follower fetched from ``leo`` (its log end) having fsync'ed below ``flushed``."""
        pos = self.followers.get(replica)
        if pos is None:
            return
        end = self.log.log_end_offset
        pos.leo = min(leo, end)
        pos.flushed = min(flushed, pos.leo) if flushed >= 0 else -1
        if pos.leo >= end:
            pos.caught_up_ms = now_ms
        elif pos.last_fetch_leo >= 0 and pos.leo >= pos.last_fetch_leo:
            pos.caught_up_ms = max(pos.caught_up_ms, pos.last_fetch_ms)
        pos.last_fetch_leo, pos.last_fetch_ms = end, now_ms
        pos.may_rejoin = replica not in self.isr and pos.leo >= self.hw
        self.advance()

    def candidate(self) -> int | None:
        """Where the HW would be now; None while the ISR is below min ISR (strict, KIP-966)."""
        if len(self.isr) < self.min_insync_replicas or self.broker_id not in self.isr:
            return None
        hw = self.log.log_end_offset
        flushed = [self.log.flushed_offset]
        for replica in self.isr:
            if replica == self.broker_id:
                continue
            pos = self.followers.get(replica)
            if pos is None or pos.leo < 0:
                return None
            hw = min(hw, pos.leo)
            flushed.append(pos.flushed)
        if self.flush_always:
            flushed.sort(reverse=True)
            hw = min(hw, flushed[self.min_insync_replicas - 1])
        return hw

    def advance(self) -> bool:
        """Move the HW to :meth:`candidate` if that is higher; wake what waits for it."""
        new = self.candidate()
        if new is None or new <= self.hw:
            return False
        self.hw = new
        waits = self._waits
        while waits and waits[0][0] < new:
            fut = heapq.heappop(waits)[2]
            if not fut.done():
                fut.set_result(None)
        if self.on_advance is not None:
            self.on_advance(self.key)
        return True

    def lagging(self, now_ms: int, max_lag_ms: int) -> list[int]:
        """ISR followers not caught up with the leader's LEO for ``max_lag_ms``, and at once those that
        fetched from below the HW: an ISR member holds everything committed, so one asking for less
        lost records it had (restarted after a power loss, or cut back to a damaged batch) and must not
        stay eligible for election until it has them again (docs/replication.md, "Power loss and
        corruption")."""
        return [
            r
            for r in self.isr
            if r != self.broker_id
            and (pos := self.followers.get(r)) is not None
            and (now_ms - pos.caught_up_ms > max_lag_ms or 0 <= pos.leo < self.hw)
        ]

    def caught_up(self) -> list[int]:
        """Followers outside the ISR whose latest fetch, in this leader epoch, reached the HW: they rejoin.
        Only a fetch makes one eligible (an old position that the HW has not left yet does not)."""
        out = []
        for r, pos in self.followers.items():
            if pos.may_rejoin:
                pos.may_rejoin = False
                if r not in self.isr and pos.leo >= self.hw:
                    out.append(r)
        return out

    # ---- acks=all -----------------------------------------------------------------------

    def wait_committed(self, last_offset: int) -> asyncio.Future[None]:
        """A future done once the HW passes ``last_offset``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.hw > last_offset:
            fut.set_result(None)
        else:
            heapq.heappush(self._waits, (last_offset, next(_ids), fut))
        return fut

    def fail_waits(self, error: SluiceError) -> None:
        """Leadership is lost (or the broker stops): every waiting produce gets ``error``."""
        waits, self._waits = self._waits, []
        for _, _, fut in waits:
            if not fut.done():
                fut.set_exception(error)


class HighWatermarkView:
    """A led, replicated partition's log as consumers see it: records only below the high watermark.

    ``log_end_offset`` stays the log's, so a consumer asking for an offset between the HW and the log end
    gets an empty answer (and waits), not OFFSET_OUT_OF_RANGE; ``high_watermark`` is the read bound.
    """

    __slots__ = ("plog", "state")

    def __init__(self, state: LeaderState) -> None:
        self.state = state
        self.plog = state.log

    @property
    def log_start_offset(self) -> int:
        return self.plog.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.plog.log_end_offset

    @property
    def high_watermark(self) -> int:
        return self.state.hw

    def read(self, offset: int, max_bytes: int, min_one: bool = True) -> ReadChunk:
        hw = self.state.hw
        if offset >= hw:
            return ReadResult(b"", offset, offset)
        chunk = self.plog.read(offset, max_bytes, min_one)
        if chunk.next_offset <= hw:
            return chunk
        return _cut_at(chunk, hw)


def _cut_at(chunk: ReadResult, hw: int) -> ReadResult:
    """The batches of ``chunk`` that start below ``hw`` (a batch boundary): header reads only."""
    data = chunk.data
    pos, end = 0, len(data)
    next_offset = chunk.base_offset_of_first
    while pos < end:
        header = read_header(data, pos)
        if header.base_offset >= hw:
            break
        next_offset = header.next_offset
        pos += header.length
    return ReadResult(data[:pos], next_offset, chunk.base_offset_of_first)


def check_enough_replicas(state: LeaderState) -> None:
    """acks=all is refused before the append while the ISR is below min ISR: the HW cannot move, so
    the write could only time out, and it would sit in the log uncommitted meanwhile."""
    if len(state.isr) < state.min_insync_replicas:
        raise NotEnoughReplicas(
            f"{state.key[0]}/{state.key[1]} has {len(state.isr)} in-sync replicas {list(state.isr)}, "
            f"fewer than its min_insync_replicas {state.min_insync_replicas}"
        )


async def wait_committed(
    states: Mapping[TopicPartitionKey, LeaderState], results: list[ProduceResult], deadline: float
) -> None:
    """Wait until the HW passes every acks=all result's last offset, or the deadline
    (``time.monotonic``): REQUEST_TIMED_OUT then (the batch may still commit later)."""
    waits: list[tuple[ProduceResult, asyncio.Future[None]]] = []
    for r in results:
        if r.error is not None or r.commit_offset < 0:
            continue
        state = states.get((r.topic, r.partition))
        if state is None:
            r.error = NotLeader(
                f"this broker stopped leading {r.topic}/{r.partition} before the write committed"
            )
            continue
        waits.append((r, state.wait_committed(r.commit_offset)))
    if not waits:
        return
    pending = [fut for _, fut in waits if not fut.done()]
    if pending:
        # Each future awaited directly: the HW advance that completes it wakes this task in the next
        # loop pass (asyncio.wait puts a waiter future, so one more pass, between the two), and the
        # acks=all answer goes out that much sooner: the partition's next batch waits for it.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                for fut in pending:
                    if not fut.done():
                        with contextlib.suppress(Exception):  # its error is read below
                            await fut
    for r, fut in waits:
        if not fut.done() or fut.cancelled():
            fut.cancel()
            r.error = RequestTimedOut(
                f"appended to {r.topic}/{r.partition} at {r.base_offset}, but the in-sync replicas did "
                "not all hold it in time (it may still commit)"
            )
        elif (err := fut.exception()) is not None:
            r.error = err if isinstance(err, SluiceError) else SluiceError(repr(err))
