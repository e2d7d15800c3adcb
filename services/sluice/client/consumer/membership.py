"""The member side of the group protocol (KIP-848), as a pure state machine: no I/O, no clock.

The member's heartbeat coroutine (``member.py``) asks :meth:`Membership.request` what to send and
when, sends it, and feeds the answer to :meth:`Membership.on_response` /
:meth:`Membership.on_error`, which return the :class:`Event` s the consumer must act on.
Time is passed in (seconds, monotonic), so tests drive it with a fake clock.

The rules it encodes:

* join with ``member_id=""`` and ``member_epoch=0``; the coordinator answers the id;
* then heartbeat every ``heartbeat_interval_ms`` (from the response) with the current
  epoch, the subscription and the partitions this member *owns*;
* an ``assignment`` in a response is the new target (absent: unchanged). The consumer
  starts partitions that appear in it and revokes the ones that left it: stop
  fetching, finish processing, commit, ``on_revoke``, and only then report them gone
  from ``owned`` (:meth:`Membership.released` asks for that heartbeat at once);
* the coordinator's ``heartbeat_now`` (on the heartbeat stream) and a release ask for a
  heartbeat at once; with one in flight, the next goes right after its answer
  (:meth:`Membership.heartbeat_now`), since the one in flight may predate the news;
* FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER / STALE_MEMBER_EPOCH: this member is a zombie.
  Its partitions are lost (no commit: another member may own them already). Once the
  consumer has dropped them (:meth:`Membership.lost_handled`), it rejoins with epoch 0
  and an empty member id (a static member is recognised by its ``instance_id``);
* no heartbeat answered for a whole ``session_timeout``: the coordinator has removed
  this member by now, so its partitions are lost the same way (docs/groups.md, rule 6);
* a refusal of the subscription itself (INCONSISTENT_SUBSCRIPTION, an unknown topic or
  assignor, a bad filter) is fatal: no more heartbeats, the consumer raises it;
* leaving sends epoch -1, or -2 for a static member (``instance_id``) that will be back.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from sluice.errors import (
    FencedMemberEpoch,
    RequestTimedOut,
    SluiceError,
    StaleMemberEpoch,
    UnknownMember,
)

__all__ = [
    "JOIN_EPOCH",
    "LEAVE_EPOCH",
    "STATIC_LEAVE_EPOCH",
    "Event",
    "Fatal",
    "HeartbeatPlan",
    "Lost",
    "MemberState",
    "Membership",
    "NewTarget",
    "TargetPartition",
]

TopicPartition = tuple[str, int]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
DEFAULT_HEARTBEAT_INTERVAL = 3.0
# Retry backoff after a failed heartbeat (coordinator restarting, network): doubles up to the interval.
_BACKOFF_FIRST = 0.1


class MemberState(enum.Enum):
    """The member's lifecycle. Transitions are asserted (see ``_TRANSITIONS``)."""

    #: Must send a join heartbeat (epoch 0): at start, and after its partitions were lost.
    UNJOINED = "unjoined"
    #: The join heartbeat is out; no epoch yet.
    JOINING = "joining"
    #: Has a member id and epoch; heartbeats on the interval.
    STABLE = "stable"
    #: Lost its membership; waits for the consumer to drop its partitions, then rejoins.
    FENCED = "fenced"
    #: The coordinator refused it for good (the error is kept); sends nothing more.
    FATAL = "fatal"
    #: ``leave()`` was called; the next request is the leave.
    LEAVING = "leaving"
    #: Left; terminal.
    LEFT = "left"
    #: Fallback that must never be reached; any transition out of it is allowed.
    UNKNOWN = "unknown"

    def move(self, to: MemberState) -> MemberState:
        assert to in _TRANSITIONS[self], f"illegal member state transition {self.name} -> {to.name}"
        return to


_TRANSITIONS: dict[MemberState, frozenset[MemberState]] = {
    MemberState.UNJOINED: frozenset(
        {MemberState.JOINING, MemberState.LEAVING, MemberState.LEFT, MemberState.FATAL}
    ),
    MemberState.JOINING: frozenset(
        {
            MemberState.STABLE,
            MemberState.UNJOINED,
            MemberState.FENCED,
            MemberState.FATAL,
            MemberState.LEAVING,
            MemberState.JOINING,
            # close() while a rejoin (no member id yet) is out: nothing to leave (see ``leave``).
            MemberState.LEFT,
        }
    ),
    MemberState.STABLE: frozenset(
        {MemberState.STABLE, MemberState.FENCED, MemberState.FATAL, MemberState.LEAVING}
    ),
    MemberState.FENCED: frozenset({MemberState.UNJOINED, MemberState.LEAVING, MemberState.LEFT}),
    MemberState.FATAL: frozenset({MemberState.LEFT, MemberState.FATAL}),
    MemberState.LEAVING: frozenset({MemberState.LEFT, MemberState.LEAVING}),
    MemberState.LEFT: frozenset({MemberState.LEFT}),
    MemberState.UNKNOWN: frozenset(MemberState),
}


@dataclass(frozen=True, slots=True)
class TargetPartition:
    """One partition of the target assignment: where its offsets live and what it reads."""

    topic: str
    partition: int
    #: The offset track commits and offset lookups use ("default" or a split track).
    track: str
    #: The tag filter this member reads the partition with.
    filter: str

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


# ---- events for the consumer ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewTarget:
    """The coordinator's new target assignment for this member, at ``epoch``."""

    epoch: int
    partitions: Mapping[TopicPartition, TargetPartition]


@dataclass(frozen=True, slots=True)
class Lost:
    """Membership lost: drop every partition without committing, then ``lost_handled()``."""

    error: SluiceError


@dataclass(frozen=True, slots=True)
class Fatal:
    """The coordinator refused this member for good; raise ``error`` to the application."""

    error: SluiceError


Event = NewTarget | Lost | Fatal


@dataclass(frozen=True, slots=True)
class HeartbeatPlan:
    """What the next heartbeat carries."""

    member_id: str
    member_epoch: int
    owned: tuple[TopicPartition, ...]
    #: A leave (epoch -1 / -2): sent once, no answer needed.
    leave: bool = False


@dataclass
class Membership:
    """The member's protocol state. Not thread-safe: the caller holds a lock."""

    instance_id: str = ""
    #: Seconds without an answered heartbeat after which the membership is presumed lost.
    session_timeout: float = 45.0
    member_id: str = ""
    member_epoch: int = JOIN_EPOCH
    state: MemberState = MemberState.UNJOINED
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    #: The partitions the consumer holds (what heartbeats report as ``owned``).
    owned: frozenset[TopicPartition] = frozenset()
    #: The latest target, as the coordinator sent it.
    target: dict[TopicPartition, TargetPartition] = field(default_factory=dict)
    error: SluiceError | None = None
    #: When the next heartbeat is due (monotonic seconds); 0 = now.
    due: float = 0.0
    in_flight: bool = False
    #: Asked to heartbeat at once while one was in flight: the next one goes right after its answer
    #: (the one in flight may predate what prompted the request).
    again: bool = False
    failures: int = 0
    #: Counts answered heartbeats, so a waiter can tell "a heartbeat happened since".
    answered: int = 0
    #: When the coordinator last answered (None: not since joining).
    last_answer: float | None = None

    # ---- the heartbeat coroutine ---------------------------------------------------------------

    def next_due(self) -> float | None:
        """When to send the next heartbeat (None: nothing to send, e.g. fenced or fatal)."""
        if self.in_flight:
            return None
        if self.state not in (MemberState.UNJOINED, MemberState.JOINING, MemberState.STABLE):
            return None
        return self.due

    def request(self, now: float) -> HeartbeatPlan:
        """The heartbeat to send now; marks it in flight."""
        assert not self.in_flight, "one heartbeat in flight at a time"
        assert self.state in (MemberState.UNJOINED, MemberState.JOINING, MemberState.STABLE), self.state
        if self.state is MemberState.UNJOINED:
            self.state = self.state.move(MemberState.JOINING)
            self.member_epoch = JOIN_EPOCH
        self.in_flight = True
        self.again = False
        return HeartbeatPlan(self.member_id, self.member_epoch, tuple(sorted(self.owned)))

    def on_response(
        self,
        now: float,
        member_id: str,
        member_epoch: int,
        heartbeat_interval_ms: int,
        assignment: list[TargetPartition] | None,
    ) -> list[Event]:
        """A heartbeat answered without error."""
        self.in_flight = False
        self.failures = 0
        self.answered += 1
        self.last_answer = now
        if self.state not in (MemberState.JOINING, MemberState.STABLE):
            return []  # left or fenced meanwhile: a late answer means nothing
        if heartbeat_interval_ms > 0:
            self.heartbeat_interval = heartbeat_interval_ms / 1000
        self.due = now if self.again else now + self.heartbeat_interval
        self.again = False
        self.member_id = member_id or self.member_id
        self.member_epoch = member_epoch
        joined = self.state is MemberState.JOINING
        self.state = self.state.move(MemberState.STABLE)
        if assignment is None:
            if not joined:
                return []
            # A join answered without an assignment: nothing is assigned yet.
            assignment = []
        target = {p.tp: p for p in assignment}
        if target == self.target and not joined:
            return []
        self.target = target
        return [NewTarget(member_epoch, dict(target))]

    def on_error(self, now: float, error: SluiceError) -> list[Event]:
        """A heartbeat failed: a refusal in the response, or the RPC itself."""
        self.in_flight = False
        self.again = False  # a retry (after the backoff) carries the latest state anyway
        if self.state in (MemberState.LEFT, MemberState.FENCED, MemberState.FATAL):
            return []
        if isinstance(error, FencedMemberEpoch | StaleMemberEpoch | UnknownMember):
            self.answered += 1
            self.last_answer = now
            return self._lose(error)
        if error.retriable:
            self.failures += 1
            silent = now - self.last_answer if self.last_answer is not None else 0.0
            if self.state is MemberState.STABLE and silent >= self.session_timeout:
                return self._lose(
                    RequestTimedOut(
                        f"no heartbeat answered for {silent:.1f} s (session timeout "
                        f"{self.session_timeout:g} s): the coordinator has removed this member ({error})"
                    )
                )
            backoff = min(_BACKOFF_FIRST * 2 ** (self.failures - 1), self.heartbeat_interval)
            self.due = now + backoff
            return []
        self.answered += 1
        self.error = error
        self.state = self.state.move(MemberState.FATAL)
        return [Fatal(error)]

    def _lose(self, error: SluiceError) -> list[Event]:
        # The epoch is kept until the consumer dropped its partitions: a commit sent
        # meanwhile carries it, and the offset store refuses it (a zombie cannot commit).
        self.state = self.state.move(MemberState.FENCED)
        self.target = {}
        return [Lost(error)]

    # ---- the consumer (application thread) -------------------------------------------------------

    def set_owned(self, owned: frozenset[TopicPartition]) -> None:
        """What the consumer holds now (it adds partitions once assigned)."""
        self.owned = owned

    def released(self, partitions: frozenset[TopicPartition], now: float) -> None:
        """The consumer committed and gave up ``partitions``: report it at once."""
        self.owned = self.owned - partitions
        self.heartbeat_now(now)

    def heartbeat_now(self, now: float) -> None:
        """Heartbeat at once: the consumer released partitions, or the coordinator asked
        (``heartbeat_now`` on the stream). With one in flight, right after its answer."""
        if self.in_flight:
            self.again = True
        self.due = min(self.due, now)

    def resend(self, now: float) -> None:
        """The heartbeat in flight was never delivered (e.g. the coordinator does not
        implement the stream): send it again at once, without counting a failure."""
        self.in_flight = False
        self.due = now

    def lost_handled(self, now: float) -> None:
        """The consumer dropped everything after a Lost event: rejoin with epoch 0."""
        if self.state is MemberState.FENCED:
            self.owned = frozenset()
            # A new id (docs/groups.md rule 5); a static member is found again by instance_id.
            self.member_id = ""
            self.member_epoch = JOIN_EPOCH
            self.last_answer = None
            self.state = self.state.move(MemberState.UNJOINED)
            self.due = now

    def leave(self) -> HeartbeatPlan | None:
        """Start leaving: the LeaveGroup to send (epoch -1, or -2 for a static member), or
        None when there is nothing to leave (never joined, fenced, refused, already left)."""
        if self.state in (MemberState.LEFT, MemberState.LEAVING):
            return None
        joined = bool(self.member_id) and self.state in (MemberState.STABLE, MemberState.JOINING)
        if not joined:
            self.state = self.state.move(MemberState.LEFT)
            return None
        self.state = self.state.move(MemberState.LEAVING)
        epoch = STATIC_LEAVE_EPOCH if self.instance_id else LEAVE_EPOCH
        return HeartbeatPlan(self.member_id, epoch, (), leave=True)

    def left(self) -> None:
        self.in_flight = False
        self.state = self.state.move(MemberState.LEFT)
