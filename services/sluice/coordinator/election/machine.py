"""The leader-election state machine: pure (no I/O, no clock; time is passed in, in seconds).

It decides; an elector's driver loop (``loop.py``) does the I/O against a lease store (a Redis key or a
Kubernetes Lease) and reports the outcome back. The rules are client-go's ``leaderelection``:

- a *follower* reads the lease every ``retry_period``. It tries to acquire the lease when it is free
  (absent or released) or when the record has not changed for the holder's declared lease duration,
  measured on the follower's own clock from when it *observed* the change (never from the timestamps in
  the record: replicas' wall clocks disagree, their clock rates do not, not by much);
- a *leader* renews every ``retry_period``. It steps down when no renewal *started* within the last
  ``renew_deadline`` succeeded. Because ``renew_deadline < lease_duration``, it stops acting as leader
  before any follower (whose countdown starts no earlier than the renewal reached the store) may acquire:
  the gap ``lease_duration - renew_deadline`` absorbs clock-rate drift and reaction time. Fail safe.

Safety does not rest on these clocks alone: every acquisition takes a new epoch, and the metadata store
refuses writes from any epoch but the newest (``MetadataStore.write``'s Lua fence). The timing keeps two
replicas from *believing* they lead at once; the fence keeps a deposed one from *writing*.

One extra rule: a record held by another identity but advertising **this** replica's own address belongs
to a dead predecessor (this process bound that address, so no live process serves it), e.g. the previous
container of the same pod, or a coordinator restarted on the same port after ``kill -9``. It is taken
over at once instead of waiting out its lease; the takeover is conditional on the exact record observed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sluice.errors import InvalidArgument

__all__ = [
    "Action",
    "ElectionMachine",
    "ElectionState",
    "ElectionTiming",
    "LeaderInfo",
    "LeaseRecord",
]


class ElectionState(enum.Enum):
    #: No trustworthy observation: just started, the store failed while following, or just stepped down.
    UNKNOWN = "unknown"
    #: Another replica holds a lease that has not expired (as far as this replica has observed).
    FOLLOWER = "follower"
    #: An acquire attempt is in flight; its outcome decides between LEADER and FOLLOWER.
    CANDIDATE = "candidate"
    #: This replica holds the lease and a renewal started within ``renew_deadline`` succeeded.
    LEADER = "leader"


_UNKNOWN, _FOLLOWER, _CANDIDATE, _LEADER = (
    ElectionState.UNKNOWN,
    ElectionState.FOLLOWER,
    ElectionState.CANDIDATE,
    ElectionState.LEADER,
)
_TRANSITIONS: dict[ElectionState, frozenset[ElectionState]] = {
    _UNKNOWN: frozenset({_UNKNOWN, _FOLLOWER, _CANDIDATE}),
    _FOLLOWER: frozenset({_FOLLOWER, _CANDIDATE, _UNKNOWN}),
    _CANDIDATE: frozenset({_LEADER, _FOLLOWER, _UNKNOWN}),
    # No LEADER -> CANDIDATE: a leader that loses the lease first finds out who holds it now.
    _LEADER: frozenset({_LEADER, _FOLLOWER, _UNKNOWN}),
}


class Action(enum.Enum):
    """What the driver must do next."""

    #: Nothing until :meth:`ElectionMachine.wake_at`.
    WAIT = "wait"
    #: Read the lease record and report it with :meth:`ElectionMachine.observed` (or ``observe_failed``).
    OBSERVE = "observe"
    #: Try to acquire the lease, conditional on the record just observed; report with ``acquired`` /
    #: ``acquire_lost`` / ``acquire_failed``.
    ACQUIRE = "acquire"
    #: Renew the lease we hold; report with ``renewed`` / ``renew_lost`` / ``renew_failed``.
    RENEW = "renew"
    #: Leadership is over: stop acting as leader now (the machine has already left LEADER). Releasing the
    #: lease afterwards is a courtesy that lets a follower take over sooner.
    STEP_DOWN = "step_down"


@dataclass(frozen=True)
class ElectionTiming:
    """The three durations of an election, in seconds (client-go's defaults are 15 / 10 / 2)."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise InvalidArgument(
                f"election timing needs 0 < --retry-period ({self.retry_period:g}s) < --renew-deadline "
                f"({self.renew_deadline:g}s) < --lease-duration ({self.lease_duration:g}s): the leader must "
                "give up before a standby may take over, and must get several renewal attempts first"
            )


@dataclass(frozen=True)
class LeaderInfo:
    """Who leads: the lease holder's identity, the address clients should use, and its epoch."""

    identity: str
    address: str
    epoch: int


@dataclass(frozen=True)
class LeaseRecord:
    """One observation of the lease, whatever store holds it.

    ``holder`` is "" when the lease was released. ``version`` is opaque and changes on every write of the
    record (a Kubernetes resourceVersion, or the Redis value itself, which carries the renewal time).
    ``epoch`` is 0 while a new Kubernetes leader has not yet recorded its fencing epoch.
    """

    holder: str
    address: str
    epoch: int
    duration: float
    version: str
    transitions: int = 0

    @property
    def free(self) -> bool:
        return not self.holder

    def info(self) -> LeaderInfo:
        return LeaderInfo(self.holder, self.address, self.epoch)


class ElectionMachine:
    """One replica's view of the election.

    Caller: an elector's driver loop, strictly alternating ``poll`` -> the I/O it asks for -> the matching
    report. Affects: nothing but itself.
    """

    def __init__(self, identity: str, address: str, timing: ElectionTiming) -> None:
        if not identity:
            raise InvalidArgument("the election identity must not be empty")
        self.identity = identity
        self.address = address
        self.timing = timing
        self._state = ElectionState.UNKNOWN
        self._now = float("-inf")
        # Following: when to read next, the last record seen and when its version last changed.
        self._next_read = float("-inf")
        self._seen: LeaseRecord | None = None
        self._seen_at = 0.0
        self._hold_off_until = float("-inf")
        # Leading: our record, the start of the last successful renewal (or of the acquisition), next renewal.
        self._held: LeaseRecord | None = None
        self._renewed_at = 0.0
        self._next_renew = 0.0

    # ---- queries -----------------------------------------------------------------------------------

    @property
    def state(self) -> ElectionState:
        return self._state

    @property
    def held(self) -> LeaseRecord | None:
        """The record this replica holds while LEADER (the driver renews and releases it)."""
        return self._held if self._state is ElectionState.LEADER else None

    @property
    def deadline(self) -> float:
        """While LEADER: the instant this replica stops acting as leader unless a renewal succeeds."""
        return self._renewed_at + self.timing.renew_deadline

    def leading(self, now: float) -> bool:
        """True while this replica may act as leader: LEADER and within the renew deadline.

        Checked against the clock on every request, so a stalled driver cannot extend leadership.
        """
        return self._state is ElectionState.LEADER and now < self.deadline

    def leader(self, now: float) -> LeaderInfo | None:
        """The leader as far as this replica knows, or None (none known, or its lease looks expired)."""
        if self._state is ElectionState.LEADER:
            assert self._held is not None
            return self._held.info() if self.leading(now) else None
        seen = self._seen
        if self._state is ElectionState.FOLLOWER and seen is not None and now < self._seen_at + seen.duration:
            return seen.info()
        return None

    def wake_at(self, now: float) -> float:
        """When the driver should call :meth:`poll` next (it may be woken earlier, e.g. by a resign)."""
        now = self._tick(now)
        if self._state is ElectionState.LEADER:
            return min(self._next_renew, self.deadline)
        if self._state is ElectionState.CANDIDATE:
            return now
        # A hold-off (after resigning) is noticed at the first read after it ends: no extra wake-up needed.
        return self._next_read

    # ---- driving -----------------------------------------------------------------------------------

    def poll(self, now: float) -> Action:
        """What to do at ``now``. A leader past its deadline leaves LEADER here (STEP_DOWN)."""
        now = self._tick(now)
        if self._state is ElectionState.LEADER:
            if now >= self.deadline:
                self._step_down(ElectionState.UNKNOWN, now)
                return Action.STEP_DOWN
            return Action.RENEW if now >= self._next_renew else Action.WAIT
        if self._state is ElectionState.CANDIDATE:
            return Action.WAIT
        return Action.OBSERVE if now >= self._next_read else Action.WAIT

    def observed(self, record: LeaseRecord | None, now: float) -> Action:
        """A read of the lease (None: no lease exists). Returns ACQUIRE or WAIT."""
        now = self._tick(now)
        self._expect(ElectionState.UNKNOWN, ElectionState.FOLLOWER)
        self._next_read = now + self.timing.retry_period
        if record is not None and record.version != (self._seen.version if self._seen else None):
            self._seen_at = now
        self._seen = record
        held_by_other = record is not None and not record.free
        if now < self._hold_off_until:
            self._go(ElectionState.FOLLOWER if held_by_other else ElectionState.UNKNOWN)
            return Action.WAIT
        if record is None or record.free or self._is_dead_predecessor(record):
            self._go(ElectionState.CANDIDATE)
            return Action.ACQUIRE
        if now >= self._seen_at + record.duration:
            # Unchanged for a whole lease duration on our clock: its holder stopped renewing.
            self._go(ElectionState.CANDIDATE)
            return Action.ACQUIRE
        self._go(ElectionState.FOLLOWER)
        return Action.WAIT

    def observe_failed(self, now: float) -> None:
        """The read failed (store unreachable): we no longer know who leads."""
        now = self._tick(now)
        self._expect(ElectionState.UNKNOWN, ElectionState.FOLLOWER)
        self._next_read = now + self.timing.retry_period
        self._go(ElectionState.UNKNOWN)

    def acquired(self, record: LeaseRecord, sent_at: float, now: float) -> Action:
        """The acquire attempt started at ``sent_at`` won: ``record`` is ours (with its new epoch).

        Returns WAIT when we lead now, or STEP_DOWN when the answer came too late to act on (the lease
        might already be up for grabs on a follower's clock): the driver then releases it.
        """
        now = self._tick(now)
        self._expect(ElectionState.CANDIDATE)
        assert record.holder == self.identity, f"acquired a record held by {record.holder!r}"
        self._held = record
        self._renewed_at = min(sent_at, now)
        self._next_renew = self._renewed_at + self.timing.retry_period
        self._go(ElectionState.LEADER)
        if now >= self.deadline:
            self._step_down(ElectionState.UNKNOWN, now)
            return Action.STEP_DOWN
        return Action.WAIT

    def acquire_lost(self, record: LeaseRecord | None, now: float) -> None:
        """Another replica won the race (``record`` is what the store holds now, if known)."""
        now = self._tick(now)
        self._expect(ElectionState.CANDIDATE)
        self._next_read = now + self.timing.retry_period
        if record is not None and not record.free and record.holder != self.identity:
            self._seen, self._seen_at = record, now
            self._go(ElectionState.FOLLOWER)
        else:
            self._go(ElectionState.UNKNOWN)

    def acquire_failed(self, now: float) -> None:
        """The attempt's outcome is unknown (store error). We do not lead; if the store did give us the
        lease, it expires (or is taken over from our own address) like any other."""
        now = self._tick(now)
        self._expect(ElectionState.CANDIDATE)
        self._next_read = now + self.timing.retry_period
        self._go(ElectionState.UNKNOWN)

    def recorded(self, record: LeaseRecord) -> None:
        """The leader rewrote its own record without renewing (e.g. to add its epoch): keep it current."""
        self._expect(ElectionState.LEADER)
        assert record.holder == self.identity
        self._held = record

    def renewed(self, record: LeaseRecord, sent_at: float, now: float) -> Action:
        """The renewal started at ``sent_at`` succeeded. Returns WAIT, or STEP_DOWN if we had already
        passed the deadline (then the machine has left LEADER: a late success does not revive it)."""
        now = self._tick(now)
        if self._state is not ElectionState.LEADER:
            return Action.WAIT  # stepped down while the renewal was in flight
        if now >= self.deadline:
            self._step_down(ElectionState.UNKNOWN, now)
            return Action.STEP_DOWN
        self._held = record
        self._renewed_at = max(self._renewed_at, min(sent_at, now))
        self._next_renew = self._renewed_at + self.timing.retry_period
        return Action.WAIT

    def renew_lost(self, record: LeaseRecord | None, now: float) -> Action:
        """The store says the lease is no longer ours. Returns STEP_DOWN (WAIT if already stepped down)."""
        now = self._tick(now)
        if self._state is not ElectionState.LEADER:
            return Action.WAIT
        self._step_down(ElectionState.UNKNOWN, now)
        if record is not None and not record.free and record.holder != self.identity:
            self._seen, self._seen_at = record, now
            self._go(ElectionState.FOLLOWER)
        return Action.STEP_DOWN

    def renew_failed(self, now: float) -> Action:
        """The renewal's outcome is unknown (store error). Keep leading until the deadline, retrying."""
        now = self._tick(now)
        if self._state is not ElectionState.LEADER:
            return Action.WAIT
        if now >= self.deadline:
            self._step_down(ElectionState.UNKNOWN, now)
            return Action.STEP_DOWN
        self._next_renew = now + self.timing.retry_period
        return Action.WAIT

    def resign(self, now: float, hold_off: float) -> Action:
        """Give up leadership (or candidacy) voluntarily and do not try to acquire for ``hold_off`` s.

        Returns STEP_DOWN when we were leading (the driver releases the lease), else WAIT.
        """
        now = self._tick(now)
        self._hold_off_until = now + hold_off
        if self._state is ElectionState.LEADER:
            self._step_down(ElectionState.UNKNOWN, now)
            return Action.STEP_DOWN
        if self._state is ElectionState.FOLLOWER:
            return Action.WAIT
        self._go(ElectionState.UNKNOWN)
        return Action.WAIT

    # ---- internals ---------------------------------------------------------------------------------

    def _is_dead_predecessor(self, record: LeaseRecord) -> bool:
        return bool(self.address) and record.address == self.address

    def _step_down(self, to: ElectionState, now: float) -> None:
        self._held = None
        self._next_read = now  # look at the lease right away: who leads now?
        self._go(to)

    def _tick(self, now: float) -> float:
        # The driver uses a monotonic clock; should it ever report an earlier instant, keep the later one
        # (time never runs backwards here, so a deadline can never be "un-passed").
        self._now = max(self._now, now)
        return self._now

    def _expect(self, *states: ElectionState) -> None:
        assert self._state in states, f"election: unexpected report in state {self._state.name}"

    def _go(self, to: ElectionState) -> None:
        assert to in _TRANSITIONS[self._state], f"election: {self._state.name} -> {to.name} is not allowed"
        self._state = to
