"""The permit counters (pure): shares, refills, zero-queue, pause, reconnects."""

from __future__ import annotations

import itertools

import pytest

from sluice.client.push.flow import FlowControl


def test_initial_flow_splits_the_queue_across_streams() -> None:
    f = FlowControl(1000, ["a", "b", "c"])
    grants = [g for k in ("a", "b", "c") for g in f.on_subscribed(k)]
    assert grants == [("a", 334), ("b", 333), ("c", 333)]
    assert f.outstanding == 1000


def test_each_stream_gets_at_least_one_permit() -> None:
    f = FlowControl(2, ["a", "b", "c"])
    assert [f.on_subscribed(k) for k in "abc"] == [[("a", 1)], [("b", 1)], [("c", 1)]]


def test_refill_when_half_of_the_share_was_taken() -> None:
    f = FlowControl(10, ["a"])
    assert f.on_subscribed("a") == [("a", 10)]
    f.on_delivered("a", 10)
    grants = [f.on_taken("a") for _ in range(5)]
    assert grants == [[], [], [], [], [("a", 5)]]
    s = f.streams["a"]
    assert (s.outstanding, s.queued, s.taken) == (5, 5, 0)
    assert s.outstanding + s.queued + s.taken == s.share


def test_over_delivery_is_counted_never_hidden() -> None:
    f = FlowControl(2, ["a"])
    f.on_subscribed("a")
    f.on_delivered("a", 3)
    assert f.over_delivered == 1
    assert f.streams["a"].outstanding == 0


def test_zero_queue_grants_one_permit_only_while_someone_waits() -> None:
    f = FlowControl(0, ["a"])
    assert f.on_subscribed("a") == []
    assert f.want_one(waiting=False) == []
    assert f.want_one(waiting=True) == [("a", 1)]
    assert f.want_one(waiting=True) == []  # one outstanding permit at most
    f.on_delivered("a", 1)
    assert f.holder is None
    assert f.want_one(waiting=True) == []  # a message is queued: no more permits
    assert f.on_taken("a") == []
    assert f.want_one(waiting=True) == [("a", 1)]
    assert f.max_queued == 1
    assert f.max_outstanding == 1


def test_zero_queue_rotates_across_streams_and_skips_disconnected_ones() -> None:
    f = FlowControl(0, ["a", "b", "c"])
    for k in "ac":
        f.on_subscribed(k)
    order = []
    for _ in range(4):
        ((key, n),) = f.want_one(waiting=True)
        assert n == 1
        order.append(key)
        f.on_delivered(key, 1)
        f.on_taken(key)
    assert order == ["a", "c", "a", "c"]
    assert f.outstanding + f.queued <= 1


def test_zero_queue_permit_of_a_lost_stream_moves_on() -> None:
    f = FlowControl(0, ["a", "b"])
    f.on_subscribed("a")
    f.on_subscribed("b")
    assert f.want_one(True) == [("a", 1)]
    f.on_disconnected("a")
    assert f.want_one(True) == [("b", 1)]


def test_disconnect_drops_queued_and_resubscribe_starts_over() -> None:
    f = FlowControl(10, ["a"])
    f.on_subscribed("a")
    f.on_delivered("a", 4)
    f.on_taken("a")
    assert f.on_disconnected("a") == 3
    assert f.dropped == 3
    assert f.on_subscribed("a") == [("a", 10)]
    assert f.streams["a"].queued == 0


def test_pause_holds_refills_and_resume_grants_them() -> None:
    f = FlowControl(4, ["a"])
    f.on_subscribed("a")
    f.pause()
    f.on_delivered("a", 4)
    assert [f.on_taken("a") for _ in range(4)] == [[], [], [], []]
    assert f.resume(waiting=False) == [("a", 4)]
    # Subscribed while paused: the share is granted on resume.
    g = FlowControl(4, ["a"])
    g.pause()
    assert g.on_subscribed("a") == []
    assert g.resume(False) == [("a", 4)]
    z = FlowControl(0, ["a"])
    z.on_subscribed("a")
    z.pause()
    assert z.want_one(True) == []
    assert z.resume(True) == [("a", 1)]


def test_negative_queue_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="receiver_queue_size"):
        FlowControl(-1)


def test_zero_queue_skips_an_idle_stream_more_and_more_until_it_delivers() -> None:
    f = FlowControl(0, ["a", "b"])
    f.on_subscribed("a")
    f.on_subscribed("b")

    def take_one() -> str:
        ((key, _),) = f.want_one(True)
        if key == "b":  # b is dry: the consumer moves the permit off it
            f.on_idle("b")
            f.on_disconnected("b")
            f.on_subscribed("b")
            ((key, _),) = f.want_one(True)
        f.on_delivered(key, 1)
        f.on_taken(key)
        return str(key)

    tried_b = []
    for i in range(40):
        before = f.streams["b"].idle_level
        take_one()
        if f.streams["b"].idle_level != before:
            tried_b.append(i)
    # b is tried again after 1, 2, 4, 8 ... grants: ever rarer, never never.
    gaps = [b - a for a, b in itertools.pairwise(tried_b)]
    assert gaps == sorted(gaps)
    assert gaps[-1] > gaps[0]
    f.on_delivered("b", 0)
    assert f.streams["b"].idle_skips == 0  # b delivered (even an empty batch resets it)
