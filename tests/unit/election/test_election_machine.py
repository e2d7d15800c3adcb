"""The pure election state machine, with a fake clock (seconds) and no I/O."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.coordinator.election.machine import (
    Action,
    ElectionMachine,
    ElectionState,
    ElectionTiming,
    LeaderInfo,
)
from sluice.errors import InvalidArgument
from tests.unit.election.election_context import TIMING, MemoryLease, held_by, replica

ME = "me.example:7600"


def machine() -> ElectionMachine:
    return ElectionMachine("me", ME, TIMING)


def state(m: ElectionMachine) -> ElectionState:
    """The machine's state read anew: mypy keeps an asserted ``m.state`` across the calls that change it."""
    return m.state


def lead(m: ElectionMachine, at: float = 0.0, epoch: int = 7) -> None:
    """Take ``m`` to LEADER by acquiring a free lease at ``at``."""
    assert m.poll(at) is Action.OBSERVE
    assert m.observed(None, at) is Action.ACQUIRE
    assert m.acquired(held_by("me", "mine-1", address=ME, epoch=epoch), at, at) is Action.WAIT


# ---- timing ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lease", "deadline", "retry"),
    [(15, 15, 2), (10, 15, 2), (15, 10, 10), (15, 10, 0), (15, 10, -1)],
)
def test_timing_must_let_the_leader_give_up_before_a_standby_takes_over(
    lease: float, deadline: float, retry: float
) -> None:
    with pytest.raises(InvalidArgument, match=r"--retry-period .* < --renew-deadline .* < --lease-duration"):
        ElectionTiming(lease_duration=lease, renew_deadline=deadline, retry_period=retry)


def test_empty_identity_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="identity"):
        ElectionMachine("", ME, TIMING)


# ---- acquiring ---------------------------------------------------------------------------------------------


def test_starts_unknown_and_reads_first() -> None:
    m = machine()
    assert m.state is ElectionState.UNKNOWN
    assert m.leader(0) is None
    assert not m.leading(0)
    assert m.poll(0) is Action.OBSERVE


def test_acquires_a_lease_nobody_holds_and_leads() -> None:
    m = machine()
    m.poll(0)
    assert m.observed(None, 0) is Action.ACQUIRE
    assert m.state is ElectionState.CANDIDATE
    assert not m.leading(0), "a candidate does not lead before the store said yes"
    assert m.poll(0.5) is Action.WAIT, "one attempt at a time"
    assert m.acquired(held_by("me", address=ME, epoch=3), 0, 0.1) is Action.WAIT
    assert state(m) is ElectionState.LEADER
    assert m.leading(0.1)
    assert m.leader(0.1) == LeaderInfo("me", ME, 3)


def test_acquires_a_released_lease_at_once() -> None:
    m = machine()
    m.poll(0)
    assert m.observed(held_by(""), 0) is Action.ACQUIRE


def test_follows_a_live_leader_and_names_it() -> None:
    m = machine()
    m.poll(0)
    assert m.observed(held_by("other", "v1"), 0) is Action.WAIT
    assert m.state is ElectionState.FOLLOWER
    assert m.leader(1) == LeaderInfo("other", "other.example:7600", 1)
    assert m.poll(1.9) is Action.WAIT
    assert m.wake_at(1.9) == 2.0
    assert m.poll(2.0) is Action.OBSERVE


def test_acquires_once_the_record_stops_changing_for_a_lease_duration() -> None:
    m = machine()
    for t in range(0, 15, 2):  # the holder stopped renewing before t=0: version stays v1
        m.poll(t)
        assert m.observed(held_by("other", "v1"), t) is Action.WAIT, t
    m.poll(15)
    assert m.observed(held_by("other", "v1"), 15) is Action.ACQUIRE, "expired exactly at the duration"


def test_a_renewing_holder_is_never_taken_over() -> None:
    m = machine()
    for i, t in enumerate(range(0, 100, 2)):
        m.poll(t)
        # The holder renews every 2 s: every read shows a new version.
        assert m.observed(held_by("other", f"v{i}"), t) is Action.WAIT


def test_expiry_counts_from_when_this_replica_saw_the_change_not_from_the_records_clock() -> None:
    m = machine()
    # The first look, long after this record was written (by the holder's clock): still a full wait,
    # because this replica cannot know how old the record is.
    m.poll(1000)
    assert m.observed(held_by("other", "v9"), 1000) is Action.WAIT
    m.poll(1014.9)
    assert m.observed(held_by("other", "v9"), 1014.9) is Action.WAIT
    m.poll(1015)
    assert m.observed(held_by("other", "v9"), 1015) is Action.ACQUIRE


def test_a_follower_stops_naming_a_leader_whose_lease_looks_expired() -> None:
    m = machine()
    m.poll(0)
    m.observed(held_by("other", "v1"), 0)
    assert m.leader(14.9) is not None
    assert m.leader(15) is None


def test_losing_the_race_makes_a_follower_of_the_winner() -> None:
    m = machine()
    m.poll(0)
    m.observed(None, 0)
    m.acquire_lost(held_by("winner"), 0.1)
    assert m.state is ElectionState.FOLLOWER
    assert m.leader(0.2) == LeaderInfo("winner", "winner.example:7600", 1)
    assert m.poll(0.2) is Action.WAIT
    assert m.poll(2.1) is Action.OBSERVE


def test_an_attempt_with_an_unknown_outcome_is_not_leadership() -> None:
    m = machine()
    m.poll(0)
    m.observed(None, 0)
    m.acquire_failed(0.1)
    assert m.state is ElectionState.UNKNOWN
    assert not m.leading(0.1)
    assert m.leader(0.1) is None
    assert m.poll(2.1) is Action.OBSERVE


def test_a_read_failure_forgets_the_leader() -> None:
    m = machine()
    m.poll(0)
    m.observed(held_by("other"), 0)
    m.poll(2)
    m.observe_failed(2)
    assert m.state is ElectionState.UNKNOWN
    assert m.leader(2) is None


def test_a_dead_predecessor_at_our_own_address_is_taken_over_at_once() -> None:
    m = machine()
    m.poll(0)
    # Same address, other identity: the process that served this address before us (we bound it).
    assert m.observed(held_by("me-before-restart", address=ME), 0) is Action.ACQUIRE


def test_an_answer_that_comes_too_late_is_not_acted_on() -> None:
    m = machine()
    m.poll(0)
    m.observed(None, 0)
    # Sent at 0, answered at 10 = the renew deadline: a follower may already count the lease as ours
    # for most of its duration; do not start leading with so little (no) margin left.
    assert m.acquired(held_by("me", address=ME), 0, 10) is Action.STEP_DOWN
    assert m.state is ElectionState.UNKNOWN
    assert not m.leading(10)


# ---- leading -----------------------------------------------------------------------------------------------


def test_leader_renews_every_retry_period() -> None:
    m = machine()
    lead(m, 0)
    assert m.poll(1.9) is Action.WAIT
    assert m.wake_at(1.9) == 2.0
    assert m.poll(2) is Action.RENEW
    assert m.renewed(held_by("me", "mine-2", address=ME, epoch=7), 2, 2.3) is Action.WAIT
    assert m.poll(3.9) is Action.WAIT
    assert m.poll(4) is Action.RENEW


def test_deadline_counts_from_when_the_renewal_was_sent() -> None:
    m = machine()
    lead(m, 0)
    m.poll(8)
    m.renewed(held_by("me", "mine-2", address=ME, epoch=7), 8, 9.5)
    assert m.deadline == 18
    assert m.leading(17.999)
    assert not m.leading(18)


def test_leader_steps_down_before_the_lease_can_expire_when_renewals_fail() -> None:
    m = machine()
    lead(m, 0)
    for t in (2.0, 4.5, 7.0):
        assert m.poll(t) is Action.RENEW
        assert m.renew_failed(t + 0.5) is Action.WAIT
        assert m.wake_at(t + 0.5) == t + 2.5, "retry one period after the failure"
        assert m.poll(t + 1) is Action.WAIT
    assert m.poll(9.5) is Action.RENEW
    assert m.renew_failed(9.6) is Action.WAIT
    assert m.wake_at(9.6) == 10, "the deadline comes before the next attempt"
    assert m.leading(9.999)
    assert m.poll(10) is Action.STEP_DOWN
    assert m.state is ElectionState.UNKNOWN
    assert not m.leading(10)
    assert m.leader(10) is None
    assert m.poll(10) is Action.OBSERVE, "find out who leads now"


def test_leader_steps_down_even_if_nobody_polls_in_time() -> None:
    # A stalled driver (GC pause) cannot extend leadership: leading() reads the clock it is given.
    m = machine()
    lead(m, 0)
    assert not m.leading(30)
    assert m.poll(30) is Action.STEP_DOWN


def test_a_renewal_confirmed_after_the_deadline_does_not_revive_leadership() -> None:
    m = machine()
    lead(m, 0)
    m.poll(9)
    assert m.renewed(held_by("me", "mine-2", address=ME, epoch=7), 9, 10.5) is Action.STEP_DOWN
    assert not m.leading(10.5)
    # And one that arrives after stepping down changes nothing.
    assert m.renewed(held_by("me", "mine-3", address=ME, epoch=7), 9, 11) is Action.WAIT
    assert m.state is ElectionState.UNKNOWN


def test_a_renew_failure_at_the_deadline_steps_down() -> None:
    m = machine()
    lead(m, 0)
    m.poll(9)
    assert m.renew_failed(10) is Action.STEP_DOWN


def test_losing_the_lease_steps_down_and_follows_the_new_holder() -> None:
    m = machine()
    lead(m, 0)
    m.poll(2)
    assert m.renew_lost(held_by("thief", "t1", epoch=8), 2.1) is Action.STEP_DOWN
    assert m.state is ElectionState.FOLLOWER
    assert m.leader(2.1) == LeaderInfo("thief", "thief.example:7600", 8)


def test_resign_steps_down_and_holds_off() -> None:
    m = machine()
    lead(m, 0)
    assert m.resign(1, hold_off=5) is Action.STEP_DOWN
    assert not m.leading(1)
    assert m.poll(1) is Action.OBSERVE
    assert m.observed(None, 1) is Action.WAIT, "holding off: let another replica take it"
    assert m.state is ElectionState.UNKNOWN
    m.poll(6)
    assert m.observed(None, 6) is Action.ACQUIRE


def test_resign_as_follower_only_holds_off() -> None:
    m = machine()
    m.poll(0)
    m.observed(held_by("other"), 0)
    assert m.resign(0, hold_off=float("inf")) is Action.WAIT
    assert m.state is ElectionState.FOLLOWER


# ---- clock edge cases and asserted transitions -------------------------------------------------------------


def test_a_clock_that_steps_back_neither_extends_leadership_nor_shortens_a_wait() -> None:
    m = machine()
    lead(m, 0)
    assert m.poll(9) is Action.RENEW
    assert m.renew_failed(9) is Action.WAIT
    assert m.poll(3) is Action.WAIT, "3 is read as 9: time never runs backwards here"
    assert m.poll(10) is Action.STEP_DOWN

    f = machine()
    f.poll(10)
    assert f.observed(held_by("other", "v1"), 10) is Action.WAIT
    f.poll(5)
    assert f.observed(held_by("other", "v1"), 5) is Action.WAIT
    f.poll(24.9)
    assert f.observed(held_by("other", "v1"), 24.9) is Action.WAIT
    f.poll(25)
    assert f.observed(held_by("other", "v1"), 25) is Action.ACQUIRE


def test_reports_that_make_no_sense_in_the_current_state_are_bugs() -> None:
    m = machine()
    with pytest.raises(AssertionError):
        m.acquired(held_by("me", address=ME), 0, 0)  # never asked to acquire
    m.poll(0)
    m.observed(None, 0)
    with pytest.raises(AssertionError):
        m.observed(None, 0)  # an attempt is in flight
    with pytest.raises(AssertionError, match="held by"):
        m.acquired(held_by("someone-else"), 0, 0)


# ---- two replicas ------------------------------------------------------------------------------------------


def test_two_candidates_one_leader_and_the_standby_takes_over_when_it_dies() -> None:
    lease = MemoryLease()
    a, b = replica("a"), replica("b")
    t = 0.0
    while t < 60:
        a.step(lease, t)
        b.step(lease, t + 0.3)
        assert not (a.machine.leading(t + 0.3) and b.machine.leading(t + 0.3))
        t += 0.5
    assert a.elected == [1], "a came first and kept it"
    assert b.elected == []
    assert b.machine.leader(t) == LeaderInfo("a", "a.example:7600", 1)

    a.alive = False  # kill -9: no more renewals, no release
    last_renewal = t
    took_over = None
    while took_over is None:
        t += 0.5
        b.step(lease, t)
        assert not (a.machine.leading(t) and b.machine.leading(t)), f"two leaders at {t}"
        if b.machine.leading(t):
            took_over = t
    assert b.elected == [2], "a new epoch"
    assert took_over - last_renewal <= TIMING.lease_duration + TIMING.retry_period + 0.5


@settings(max_examples=300, deadline=None)
@given(
    renewals=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=3.0), st.floats(min_value=0.0, max_value=6.0)),
        max_size=12,
    ),
    read_offset=st.floats(min_value=0.0, max_value=1.99),
    read_every=st.floats(min_value=0.05, max_value=2.0),
)
def test_never_two_leaders_whatever_the_timing(
    renewals: list[tuple[float, float]], read_offset: float, read_every: float
) -> None:
    """The leader renews one renewal at a time, each reaching the store ``there`` seconds after it was
    sent and confirmed ``back`` seconds after that; then it dies. A standby reads every ``read_every`` s
    and sees the record as of that moment. Whenever it decides to acquire, the old leader no longer
    leads by its own clock (both clocks run at the same rate)."""
    lease = MemoryLease()
    a, b = replica("a"), replica("b")
    a.step(lease, 0.0)
    first = lease.record
    assert first is not None
    assert a.machine.leading(0.0)
    # (store time, version) of every write the leader makes.
    writes: list[tuple[float, str]] = [(0.0, first.version)]
    sent, confirmed = 0.0, 0.0
    for i, (there, back) in enumerate(renewals, start=1):
        sent = max(sent + TIMING.retry_period, confirmed)
        held = a.machine.held
        if held is None or a.machine.poll(sent) is not Action.RENEW:
            break
        version = f"r{i}"
        writes.append((sent + there, version))
        confirmed = sent + there + back
        a.machine.renewed(replace(held, version=version), sent, confirmed)
    writes.sort()
    t = read_offset
    while t < writes[-1][0] + 2 * TIMING.lease_duration:
        t += read_every
        seen = [v for at, v in writes if at <= t][-1]
        b.machine.poll(t)
        if b.machine.state not in (ElectionState.UNKNOWN, ElectionState.FOLLOWER):
            continue
        if b.machine.observed(replace(first, version=seen), t) is Action.ACQUIRE:
            assert not a.machine.leading(t), f"the standby acquires at {t} while the leader still leads"
            break
