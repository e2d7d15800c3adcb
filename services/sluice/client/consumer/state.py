"""Subscription state: the assignment snapshot and each assigned partition's positions.

Three numbers per partition (offsets are "next offset to consume"):

* ``position``: where ``poll()`` continues; it moves past every record handed out
  and past what a tag filter skipped (the fetch response's ``next_offset``);
* ``committable``: the offset it is safe to commit now. Records handed out and not
  yet processed hold it back: in ``poll`` mode those of the latest ``poll()`` (until
  the next ``poll()`` or an explicit ``commit()``); in
  ``in-flight-min`` mode the smallest offset not yet ``done()`` (RocketMQ's
  process-queue rule: never commit past an unfinished record). When nothing is in
  flight it follows ``position``, so a partition whose filter matched nothing still
  commits its progress;
* ``committed``: what this member last committed (-1: nothing known).

The assignment itself is an immutable :class:`Assignment`, replaced (never edited)
when the coordinator sends a new target; the old one's ``stale`` event fires then.

Not thread-safe on its own: the Consumer holds its lock around every call.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sluice.client.consumer.membership import TargetPartition

__all__ = ["Assignment", "InFlight", "PartitionLifecycle", "PartitionState", "SubscriptionState"]

TopicPartition = tuple[str, int]


class PartitionLifecycle(enum.Enum):
    """An assigned partition's lifecycle. Transitions are asserted (see ``_TRANSITIONS``)."""

    #: Assigned; its committed offset is not looked up yet (or auto_offset_reset=none left it unset).
    AWAITING_POSITION = "awaiting_position"
    FETCHING = "fetching"
    #: Paused by the application: not fetched, nothing buffered.
    PAUSED = "paused"
    #: Removed from the target: not fetched; waits for its in-flight records, then commits and goes.
    REVOKING = "revoking"
    #: Fallback that must never be reached; any transition out of it is allowed.
    UNKNOWN = "unknown"

    def move(self, to: PartitionLifecycle) -> PartitionLifecycle:
        assert to in _TRANSITIONS[self], f"illegal partition transition {self.name} -> {to.name}"
        return to


_L = PartitionLifecycle
_TRANSITIONS: dict[PartitionLifecycle, frozenset[PartitionLifecycle]] = {
    _L.AWAITING_POSITION: frozenset({_L.AWAITING_POSITION, _L.FETCHING, _L.PAUSED, _L.REVOKING}),
    # FETCHING -> AWAITING_POSITION: the topic was re-created under the partition (``restart``).
    _L.FETCHING: frozenset({_L.FETCHING, _L.PAUSED, _L.REVOKING, _L.AWAITING_POSITION}),
    _L.PAUSED: frozenset({_L.PAUSED, _L.FETCHING, _L.AWAITING_POSITION, _L.REVOKING}),
    _L.REVOKING: frozenset({_L.REVOKING}),
    _L.UNKNOWN: frozenset(PartitionLifecycle),
}


class InFlight:
    """Offsets handed to the application and not yet done, in hand-out order.

    ``min()`` is amortised O(1): done offsets are dropped from the front lazily.
    ``done()`` of an offset that is not in flight (already done, or from before a
    seek) changes nothing.
    """

    __slots__ = ("_order", "_pending")

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._pending: set[int] = set()

    def add(self, offsets: Iterable[int]) -> None:
        batch = list(offsets)
        self._order.extend(batch)
        self._pending.update(batch)

    def done(self, offset: int) -> None:
        pending = self._pending
        if offset not in pending:
            return
        pending.discard(offset)
        order = self._order
        while order and order[0] not in pending:
            order.popleft()

    def min(self) -> int | None:
        return self._order[0] if self._order else None

    def __contains__(self, offset: object) -> bool:
        return offset in self._pending

    def __len__(self) -> int:
        return len(self._pending)

    def clear(self) -> None:
        self._order.clear()
        self._pending.clear()


@dataclass(eq=False)
class PartitionState:
    tp: TopicPartition
    track: str
    filter: str
    lifecycle: PartitionLifecycle = PartitionLifecycle.AWAITING_POSITION
    position: int = -1
    committable: int = -1
    committed: int = -1
    #: Bumped on every seek/pause/revoke: buffered data fetched under another epoch is stale.
    fetch_epoch: int = 0
    in_flight: InFlight = field(default_factory=InFlight)
    #: Set when its position could not be found (auto_offset_reset=none): raised by poll.
    position_error: Exception | None = None

    def advance_committable(self) -> None:
        """Recompute ``committable`` after records were handed out or done."""
        low = self.in_flight.min()
        self.committable = self.position if low is None else low


@dataclass(frozen=True)
class Assignment:
    """The target assignment as the coordinator last sent it. Replaced, never edited."""

    epoch: int = 0
    partitions: Mapping[TopicPartition, TargetPartition] = field(default_factory=dict)
    #: Fires when a newer assignment replaces this one (in-flight work can tell it is stale).
    stale: threading.Event = field(default_factory=threading.Event, compare=False)


class SubscriptionState:
    """The assigned partitions and their positions.

    Caller: the Consumer, under its lock. Methods are grouped by who drives them.
    """

    def __init__(self, in_flight_min: bool) -> None:
        self.in_flight_min = in_flight_min
        self.assignment = Assignment()
        self.parts: dict[TopicPartition, PartitionState] = {}

    # ---- the coordinator's target (Caller: Consumer._apply_target) -------------------------------

    def replace_assignment(self, new: Assignment) -> None:
        """Affects: ``assignment``; fires the old snapshot's ``stale`` event."""
        old, self.assignment = self.assignment, new
        old.stale.set()

    def add(self, target: TargetPartition) -> PartitionState:
        """A newly assigned partition, awaiting its position. Affects: ``parts``."""
        assert target.tp not in self.parts, f"{target.tp} is assigned twice"
        part = PartitionState(target.tp, target.track, target.filter)
        self.parts[target.tp] = part
        return part

    def start(self, part: PartitionState, position: int, committed: int) -> None:
        """Its position is known: fetch from it. Affects: the partition's offsets and epoch."""
        part.lifecycle = part.lifecycle.move(PartitionLifecycle.FETCHING)
        part.position = position
        part.committable = position
        part.committed = committed
        part.position_error = None
        part.in_flight.clear()
        part.fetch_epoch += 1

    def restart(self, part: PartitionState) -> None:
        """Its position belongs to a topic that was deleted and re-created under the same name: forget it
        (and what was committed), so the position is looked up again. A paused partition stays paused and
        looks it up when resumed. Affects: lifecycle, offsets, epoch (drops buffered data)."""
        if part.lifecycle is not PartitionLifecycle.PAUSED:
            part.lifecycle = part.lifecycle.move(PartitionLifecycle.AWAITING_POSITION)
        part.position = part.committable = part.committed = -1
        part.position_error = None
        part.in_flight.clear()
        part.fetch_epoch += 1

    def begin_revoke(self, part: PartitionState) -> None:
        """Stop handing out its records. Affects: lifecycle, epoch (drops buffered data)."""
        part.lifecycle = part.lifecycle.move(PartitionLifecycle.REVOKING)
        part.fetch_epoch += 1

    def remove(self, tp: TopicPartition) -> PartitionState | None:
        return self.parts.pop(tp, None)

    # ---- the application (Caller: Consumer.poll / done / seek / pause / resume) ------------------

    def returned_done(self) -> None:
        """``poll`` mode: everything handed out so far is processed (Caller: the next poll(),
        an explicit commit(), close())."""
        if self.in_flight_min:
            return
        for part in self.parts.values():
            if part.lifecycle is PartitionLifecycle.FETCHING or part.lifecycle is PartitionLifecycle.PAUSED:
                part.committable = part.position

    def handed_out(self, part: PartitionState, offsets: Iterable[int], next_position: int) -> None:
        """Records of ``part`` up to ``next_position`` were returned by poll."""
        part.position = next_position
        if self.in_flight_min:
            part.in_flight.add(offsets)
            part.advance_committable()

    def skipped_to(self, part: PartitionState, next_position: int, nothing_in_flight: bool) -> None:
        """A fetch found nothing (more) for ``part`` before ``next_position`` (filtered out or
        reset): the position moves, and so does ``committable`` when nothing is in flight."""
        # The fetcher's position is the truth for this fetch epoch (a reset may even move it back).
        part.position = next_position
        if self.in_flight_min:
            part.advance_committable()
        elif nothing_in_flight:
            part.committable = part.position

    def done(self, tp: TopicPartition, offset: int) -> PartitionState | None:
        """``in-flight-min`` mode: the application finished the record at ``offset``."""
        part = self.parts.get(tp)
        if part is None:
            return None
        part.in_flight.done(offset)
        part.advance_committable()
        return part

    def seek(self, part: PartitionState, offset: int) -> None:
        if part.lifecycle is PartitionLifecycle.AWAITING_POSITION:
            self.start(part, offset, part.committed)
            return
        part.position = offset
        part.in_flight.clear()
        part.committable = offset
        part.fetch_epoch += 1

    def pause(self, part: PartitionState) -> None:
        part.lifecycle = part.lifecycle.move(PartitionLifecycle.PAUSED)
        part.fetch_epoch += 1

    def resume(self, part: PartitionState) -> None:
        target = PartitionLifecycle.FETCHING if part.position >= 0 else PartitionLifecycle.AWAITING_POSITION
        part.lifecycle = part.lifecycle.move(target)
        part.fetch_epoch += 1

    # ---- commits (Caller: Consumer.commit / auto-commit / revoke / close) -----------------------

    def to_commit(self, tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, tuple[int, str]]:
        """{tp: (offset, track)} whose committable offset moved past what was committed."""
        out: dict[TopicPartition, tuple[int, str]] = {}
        for tp in self.parts if tps is None else tps:
            part = self.parts.get(tp)
            if part is None or part.committable < 0:
                continue
            if part.lifecycle is PartitionLifecycle.AWAITING_POSITION:
                continue
            if part.committable > part.committed:
                out[tp] = (part.committable, part.track)
        return out

    def committed_ok(self, tp: TopicPartition, offset: int) -> None:
        part = self.parts.get(tp)
        if part is not None and offset > part.committed:
            part.committed = offset

    # ---- views ------------------------------------------------------------------------------------

    def owned(self) -> frozenset[TopicPartition]:
        return frozenset(self.parts)

    def tracks(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, str]:
        return {tp: self.parts[tp].track for tp in tps if tp in self.parts}
