"""The member's protocol state machine, driven with a fake clock (no network)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.client.consumer.membership import (
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    Fatal,
    Lost,
    Membership,
    MemberState,
    NewTarget,
    TargetPartition,
)
from sluice.errors import (
    BrokerNotAvailable,
    FencedMemberEpoch,
    InconsistentSubscription,
    UnknownMember,
)


def tp(p: int, track: str = "default", filt: str = "*") -> TargetPartition:
    return TargetPartition("orders", p, track, filt)


@dataclass
class Ctx:
    """A Membership plus a fake clock."""

    m: Membership = field(default_factory=Membership)
    now: float = 100.0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def due_now(self) -> bool:
        due = self.m.next_due()
        return due is not None and due <= self.now

    def answer(
        self,
        epoch: int,
        assignment: list[TargetPartition] | None,
        member_id: str = "m-1",
        interval_ms: int = 3000,
    ) -> list[object]:
        plan = self.m.request(self.now)
        assert plan.member_epoch >= 0
        return list(self.m.on_response(self.now, member_id, epoch, interval_ms, assignment))


def test_join_with_empty_id_and_epoch_zero_then_heartbeat_on_the_interval() -> None:
    ctx = Ctx()
    assert ctx.due_now()
    plan = ctx.m.request(ctx.now)
    assert (plan.member_id, plan.member_epoch, plan.owned) == ("", 0, ())
    assert ctx.m.next_due() is None  # one heartbeat in flight at a time
    events = ctx.m.on_response(ctx.now, "m-1", 3, 1500, [tp(0), tp(1)])
    assert events == [NewTarget(3, {("orders", 0): tp(0), ("orders", 1): tp(1)})]
    assert ctx.m.state is MemberState.STABLE
    assert not ctx.due_now()
    ctx.advance(1.49)
    assert not ctx.due_now()
    ctx.advance(0.02)
    assert ctx.due_now()
    ctx.m.set_owned(frozenset({("orders", 0), ("orders", 1)}))
    plan = ctx.m.request(ctx.now)
    assert (plan.member_id, plan.member_epoch, plan.owned) == ("m-1", 3, (("orders", 0), ("orders", 1)))


def test_join_answered_without_assignment_is_an_empty_target() -> None:
    ctx = Ctx()
    assert ctx.answer(1, None) == [NewTarget(1, {})]
    # Later answers without an assignment change nothing.
    ctx.advance(3)
    assert ctx.answer(1, None) == []


def test_an_unchanged_assignment_is_not_an_event() -> None:
    ctx = Ctx()
    ctx.answer(1, [tp(0)])
    ctx.advance(3)
    assert ctx.answer(2, [tp(0)]) == []
    assert ctx.m.member_epoch == 2
    ctx.advance(3)
    assert ctx.answer(3, [tp(0), tp(1)]) == [NewTarget(3, {("orders", 0): tp(0), ("orders", 1): tp(1)})]


def test_release_reports_the_partitions_gone_at_once() -> None:
    ctx = Ctx()
    ctx.answer(1, [tp(0), tp(1)])
    ctx.m.set_owned(frozenset({("orders", 0), ("orders", 1)}))
    ctx.advance(0.5)
    ctx.answer(1, [tp(0)])  # partition 1 is to be revoked
    assert not ctx.due_now()
    ctx.m.released(frozenset({("orders", 1)}), ctx.now)
    assert ctx.due_now()  # no need to wait for the interval
    assert ctx.m.request(ctx.now).owned == (("orders", 0),)


def test_fenced_member_loses_everything_keeps_its_epoch_until_handled_then_rejoins() -> None:
    ctx = Ctx()
    ctx.answer(4, [tp(0)])
    ctx.m.set_owned(frozenset({("orders", 0)}))
    ctx.advance(3)
    ctx.m.request(ctx.now)
    events = ctx.m.on_error(ctx.now, FencedMemberEpoch("fenced"))
    assert len(events) == 1
    assert isinstance(events[0], Lost)
    assert ctx.m.state is MemberState.FENCED
    assert ctx.m.member_epoch == 4  # a zombie commit still carries it (and is refused)
    assert ctx.m.next_due() is None  # no heartbeat until the consumer dropped its partitions
    ctx.m.lost_handled(ctx.now)
    plan = ctx.m.request(ctx.now)
    assert (plan.member_id, plan.member_epoch, plan.owned) == ("", 0, ())


def test_unknown_member_rejoins_with_a_new_id() -> None:
    ctx = Ctx()
    ctx.answer(2, [tp(0)])
    ctx.advance(3)
    ctx.m.request(ctx.now)
    assert isinstance(ctx.m.on_error(ctx.now, UnknownMember("gone"))[0], Lost)
    ctx.m.lost_handled(ctx.now)
    assert ctx.m.request(ctx.now).member_id == ""


def test_no_answer_for_a_session_timeout_loses_the_partitions() -> None:
    ctx = Ctx(Membership(session_timeout=2.0))
    ctx.answer(2, [tp(0)], interval_ms=500)
    ctx.advance(0.5)
    lost: list[object] = []
    while not lost:
        ctx.m.request(ctx.now)
        lost = list(ctx.m.on_error(ctx.now, BrokerNotAvailable("coordinator down")))
        ctx.advance(0.3)
    assert isinstance(lost[0], Lost)
    assert ctx.now - 100.0 >= 2.0
    ctx.m.lost_handled(ctx.now)
    assert ctx.m.request(ctx.now).member_epoch == 0


def test_retriable_failures_back_off_and_keep_the_membership() -> None:
    ctx = Ctx()
    ctx.answer(2, [tp(0)], interval_ms=3000)
    ctx.advance(3)
    for expected in (0.1, 0.2, 0.4, 0.8, 1.6, 3.0, 3.0):
        ctx.m.request(ctx.now)
        assert ctx.m.on_error(ctx.now, BrokerNotAvailable("down")) == []
        assert ctx.m.state is MemberState.STABLE
        assert ctx.m.next_due() == ctx.now + expected
        ctx.advance(expected)
    assert ctx.answer(2, None) == []
    assert ctx.m.failures == 0


def test_a_refused_subscription_is_fatal() -> None:
    ctx = Ctx()
    ctx.m.request(ctx.now)
    err = InconsistentSubscription("member m-0 holds filter 'tagA'")
    events = ctx.m.on_error(ctx.now, err)
    assert events == [Fatal(err)]
    assert ctx.m.state is MemberState.FATAL
    assert ctx.m.error is err
    assert ctx.m.next_due() is None
    assert ctx.m.leave() is None  # never joined: nothing to leave


def test_leave_epochs() -> None:
    ctx = Ctx()
    ctx.answer(1, [])
    plan = ctx.m.leave()
    assert plan is not None
    assert plan.member_epoch == LEAVE_EPOCH
    assert plan.member_id == "m-1"
    assert ctx.m.next_due() is None
    assert ctx.m.leave() is None

    static = Ctx(Membership(instance_id="host-1"))
    static.answer(1, [])
    plan = static.m.leave()
    assert plan is not None
    assert plan.member_epoch == STATIC_LEAVE_EPOCH


def test_closing_while_the_first_join_is_out_has_nothing_to_leave() -> None:
    """close() right after a fence, while the rejoin (no member id yet) travels: no leave to send, and
    no illegal JOINING -> LEFT transition (it used to fail a consumer's close() in that window)."""
    ctx = Ctx()
    plan = ctx.m.request(ctx.now)  # the join is out: JOINING, no member id
    assert (plan.member_id, ctx.m.state) == ("", MemberState.JOINING)
    assert ctx.m.leave() is None
    assert ctx.m.state is MemberState.LEFT


def test_a_late_answer_after_leaving_is_ignored() -> None:
    ctx = Ctx()
    ctx.answer(1, [tp(0)])
    ctx.advance(3)
    ctx.m.request(ctx.now)
    ctx.m.leave()
    assert ctx.m.on_response(ctx.now, "m-1", 2, 3000, [tp(1)]) == []
    assert ctx.m.state is MemberState.LEAVING


def test_illegal_transitions_are_asserted() -> None:
    import pytest

    with pytest.raises(AssertionError):
        MemberState.LEFT.move(MemberState.STABLE)
    assert MemberState.UNKNOWN.move(MemberState.STABLE) is MemberState.STABLE


def test_heartbeat_now_while_one_is_in_flight_sends_the_next_right_after_its_answer() -> None:
    """A release (or the coordinator's heartbeat_now) while a heartbeat is out: the one in flight may
    predate it, so the next one goes as soon as it is answered instead of an interval later."""
    ctx = Ctx()
    ctx.answer(1, [tp(0), tp(1)])
    ctx.m.set_owned(frozenset({("orders", 0), ("orders", 1)}))
    ctx.advance(3.0)
    ctx.m.request(ctx.now)  # in flight
    ctx.m.released(frozenset({("orders", 1)}), ctx.now)
    assert ctx.m.next_due() is None  # still one at a time
    ctx.m.on_response(ctx.now, "m-1", 1, 3000, None)
    assert ctx.due_now()
    plan = ctx.m.request(ctx.now)
    assert plan.owned == (("orders", 0),)
    ctx.m.on_response(ctx.now, "m-1", 1, 3000, None)
    assert not ctx.due_now()  # back to the interval
    ctx.advance(3.0)
    assert ctx.due_now()


def test_heartbeat_now_when_idle_is_due_at_once_and_resend_counts_no_failure() -> None:
    ctx = Ctx()
    ctx.answer(1, [tp(0)])
    assert not ctx.due_now()
    ctx.m.heartbeat_now(ctx.now)
    assert ctx.due_now()
    ctx.m.request(ctx.now)
    ctx.m.resend(ctx.now)  # e.g. the coordinator has no stream: the same heartbeat goes unary, now
    assert ctx.due_now()
    assert ctx.m.failures == 0
    assert ctx.m.state is MemberState.STABLE
