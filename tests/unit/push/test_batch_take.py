"""The batch side of the push consumer's pure parts: taking (and giving back) many messages at once
in the permit counters, and many acks handed to the stream's writer at once."""

from __future__ import annotations

import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.client.push.flow import FlowControl
from sluice.client.push.outbound import ACK_BATCH, Outbound
from sluice.v1 import dispatcher_pb2 as pb


def test_a_batch_take_refills_once_like_the_same_single_takes() -> None:
    one, many = FlowControl(10, ["a"]), FlowControl(10, ["a"])
    for f in (one, many):
        f.on_subscribed("a")
        f.on_delivered("a", 10)
    singles = [g for _ in range(7) for g in one.on_taken("a")]
    assert singles == [("a", 5)]  # at the threshold, then 2 taken and owed
    assert many.on_taken("a", 7) == [("a", 7)]  # one grant for the whole batch
    for f in (one, many):
        s = f.streams["a"]
        assert s.outstanding + s.queued + s.taken == s.share
        assert f.taken_total == 7


def test_giving_back_after_the_grant_leaves_a_debt_that_the_next_takes_pay() -> None:
    f = FlowControl(10, ["a"])
    f.on_subscribed("a")
    f.on_delivered("a", 10)
    assert f.on_taken("a", 8) == [("a", 8)]
    f.on_untaken("a", 3)  # an iterator left with 3 not yielded: back in the queue
    s = f.streams["a"]
    assert (s.outstanding, s.queued, s.taken) == (8, 5, -3)
    assert s.outstanding + s.queued + s.taken == s.share
    assert f.on_taken("a", 3) == []  # the debt: those 3 were granted already
    assert f.on_taken("a", 5) == [("a", 5)]
    assert f.outstanding + f.queued + s.taken == 10


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["take", "untake", "deliver"]), st.integers(1, 6)), max_size=60))
def test_batches_never_hold_more_than_the_share(ops: list[tuple[str, int]]) -> None:
    """Whatever mix of batch takes, give-backs and deliveries: the invariant holds, and the stream
    has more out and queued than its share only by a debt of given-back messages (which the
    application held already: the consumer holds no more messages than before), never more than
    it gave back."""
    f = FlowControl(12, ["a"])
    f.on_subscribed("a")
    s = f.streams["a"]
    given_out = 0  # taken and not given back
    untaken = 0  # given back, in all
    for op, asked in ops:
        if op == "deliver":
            n = min(asked, s.outstanding)
            if n:
                f.on_delivered("a", n)
        elif op == "take":
            n = min(asked, s.queued)
            if n:
                f.on_taken("a", n)
                given_out += n
        else:
            n = min(asked, given_out)
            if n:
                f.on_untaken("a", n)
                given_out -= n
                untaken += n
        assert s.outstanding + s.queued + s.taken == s.share
        debt = max(0, -s.taken)
        assert debt <= untaken
        assert s.outstanding + s.queued <= s.share + debt
        assert f.over_delivered == 0


def test_ack_many_wakes_the_writer_once_and_leaves_as_ranges() -> None:
    out = Outbound(pb.Subscribe())
    out.ack_ranges = True
    it = iter(out)
    next(it)  # subscribe
    got: list[pb.ConsumerCommand] = []
    t = threading.Thread(target=lambda: got.append(next(it)))
    t.start()
    time.sleep(0.05)  # the writer is waiting for work
    out.ack_many([(0, o, 4) for o in range(ACK_BATCH)] + [(3, 7, 4)])
    t.join(5)
    assert not t.is_alive()
    (cmd,) = got
    assert [(r.partition, list(r.bounds)) for r in cmd.ack.ranges] == [(0, [0, ACK_BATCH]), (3, [7, 8])]
    assert [r.leader_epoch for r in cmd.ack.ranges] == [4, 4]  # one epoch: one group, as before
    assert out.sent["ack"] == 1
