"""Backoff, outbound coalescing (acks as ranges), config validation, the nack backoff schedule and
reading messages out of forwarded record batches."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from sluice.client.push.config import KeySharedPolicy, PushConsumerConfig, dlq_topic
from sluice.client.push.message import messages_of
from sluice.client.push.nacks import NackScheduler, backoff_hold
from sluice.client.push.outbound import ACK_BATCH, Outbound, ack_ranges
from sluice.codec.batch import BatchBuilder, BatchView, stamp
from sluice.common.backoff import Backoff
from sluice.errors import InvalidArgument, InvalidFilter
from sluice.v1 import dispatcher_pb2 as pb


def test_backoff_doubles_to_60s_and_resets() -> None:
    b = Backoff(0.1, 60.0, jitter=False)
    delays = [b.next() for _ in range(12)]
    assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
    assert delays[-1] == 60.0
    assert max(delays) == 60.0
    b.reset()
    assert b.next() == 0.1
    j = Backoff(0.1, 60.0)
    assert 0.09 <= j.next() <= 0.1


def test_outbound_coalesces_pending_commands_acks_first() -> None:
    out = Outbound(pb.Subscribe(topic="t", subscription="s"))
    it = iter(out)
    assert next(it).WhichOneof("command") == "subscribe"
    out.flow(3)
    out.ack(0, 1)
    out.ack(1, 7)
    out.nack(2, 5)
    out.ack_cumulative(3, 10)
    out.ack_cumulative(3, 4)  # lower: ignored
    out.flow(2)
    cmds = [next(it) for _ in range(4)]
    assert [c.WhichOneof("command") for c in cmds] == ["ack", "ack", "nack", "flow"]
    assert [(i.partition, i.offset) for i in cmds[0].ack.ids] == [(0, 1), (1, 7)]
    assert not cmds[0].ack.cumulative
    assert cmds[1].ack.cumulative
    assert [(i.partition, i.offset) for i in cmds[1].ack.ids] == [(3, 10)]
    assert [(i.partition, i.offset) for i in cmds[2].nack.ids] == [(2, 5)]
    assert cmds[3].flow.permits == 5
    assert out.sent == {"flow": 1, "ack": 2, "nack": 1, "permits": 5}


def test_outbound_writer_waits_and_finish_drains_first() -> None:
    out = Outbound(pb.Subscribe())
    got: list[pb.ConsumerCommand] = []
    t = threading.Thread(target=lambda: got.extend(out))
    t.start()
    out.ack(0, 1)
    out.finish()
    t.join(5)
    assert not t.is_alive()
    assert [c.WhichOneof("command") for c in got] == ["subscribe", "ack"]
    closed = Outbound(pb.Subscribe())
    closed.ack(0, 1)
    closed.close()
    assert [c.WhichOneof("command") for c in closed] == ["subscribe"]  # close drops the rest


def test_config_converts_and_rejects() -> None:
    cfg = PushConsumerConfig().replace(
        nack_delay="250ms", initial_position="42", key_shared_policy=[(0, 100)]
    )
    assert cfg.nack_delay == timedelta(milliseconds=250)
    assert cfg.initial_position == 42
    assert cfg.key_shared_policy == KeySharedPolicy.sticky((0, 100))
    sub = cfg.to_subscribe("t", "s", "key_shared", "cid", "name", [1, 2])
    assert sub.initial_position == pb.INITIAL_POSITION_OFFSET
    assert sub.initial_offset == 42
    assert sub.nack_delay_ms == 250
    assert list(sub.partitions) == [1, 2]
    assert sub.type == pb.SUBSCRIPTION_TYPE_KEY_SHARED
    assert sub.key_shared_policy.mode == pb.KEY_SHARED_MODE_STICKY
    assert list(sub.key_shared_policy.ranges) == [
        0,
        100,
    ]
    for bad in (
        {"receiver_queue_size": -1},
        {"receiver_queue_size": True},
        {"initial_position": "middle"},
        {"max_unacked": 2**31},
        {"nack_delay": "soon"},
        {"reconnect_backoff": 0},
        {"no_such_setting": 1},
        {"key_shared_policy": [(5, 1)]},
        {"message_listener": 3},
    ):
        with pytest.raises(InvalidArgument):
            PushConsumerConfig().replace(**bad)
    with pytest.raises(InvalidFilter):
        PushConsumerConfig(filter="a ||")
    assert dlq_topic("orders", "s") == "orders.s.DLQ"


def test_nack_backoff_schedule() -> None:
    assert backoff_hold(0.1, 60, 0) == 0.0  # first nack: the dispatcher's delay alone
    assert backoff_hold(0.1, 60, 1) == pytest.approx(0.1)  # 200 ms in all
    assert backoff_hold(0.1, 60, 2) == pytest.approx(0.3)  # 400 ms in all
    assert backoff_hold(0.1, 1.0, 10) == pytest.approx(0.9)  # capped
    s = NackScheduler()
    fired: list[int] = []
    done = threading.Event()

    def fire_last() -> None:
        fired.append(2)
        done.set()

    s.schedule(0.05, fire_last)
    s.schedule(0.01, lambda: fired.append(1))
    assert done.wait(2)
    assert fired == [1, 2]
    s.close()


def test_outbound_acks_linger_then_leave_as_ranges() -> None:
    out = Outbound(pb.Subscribe())
    out.ack_ranges = True
    it = iter(out)
    next(it)  # subscribe
    got: list[pb.ConsumerCommand] = []
    t = threading.Thread(target=lambda: got.append(next(it)))
    t.start()
    time.sleep(0.05)  # the writer is waiting for work
    start = time.monotonic()
    for o in (5, 3, 4, 9):
        out.ack(0, o)
    out.ack(2, 1)
    t.join(5)
    assert time.monotonic() - start < 1.0, "a lone batch of acks leaves after the linger"
    (cmd,) = got
    assert not cmd.ack.ids
    assert [(r.partition, list(r.bounds)) for r in cmd.ack.ranges] == [(0, [3, 6, 9, 10]), (2, [1, 2])]
    # A full batch does not wait for the linger; a flow takes pending acks along at once.
    for o in range(ACK_BATCH):
        out.ack(1, o)
    assert [(r.partition, list(r.bounds)) for r in next(it).ack.ranges] == [(1, [0, ACK_BATCH])]
    out.ack(1, 1000)
    out.flow(1)
    assert [c.WhichOneof("command") for c in (next(it), next(it))] == ["ack", "flow"]
    assert out.sent["ack"] == 3


def test_outbound_acks_and_nacks_carry_the_leader_epoch_of_their_records() -> None:
    """One OffsetRanges per partition and epoch (docs/dispatcher.md, "Acks across a truncation"): the old
    record at 20 and the new one there after a truncation are acked apart; no epoch leaves it unset."""
    out = Outbound(pb.Subscribe(), ack_group_time=0)
    out.ack_ranges = True
    it = iter(out)
    next(it)  # subscribe
    out.ack_many([(0, 20, 1), (0, 21, 1), (0, 20, 2), (0, 22, None)])
    out.ack_cumulative(1, 9, 2)
    out.nack(0, 5, 3)
    ranges, cumulative, nacks = next(it), next(it), next(it)

    def epoch(m: pb.OffsetRanges | pb.MessageId) -> int | None:
        return m.leader_epoch if m.HasField("leader_epoch") else None

    got = {(r.partition, epoch(r), tuple(r.bounds)) for r in ranges.ack.ranges}
    assert got == {(0, 1, (20, 22)), (0, 2, (20, 21)), (0, None, (22, 23))}
    assert [(i.partition, i.offset, epoch(i)) for i in cumulative.ack.ids] == [(1, 9, 2)]
    assert [(i.partition, i.offset, epoch(i)) for i in nacks.nack.ids] == [(0, 5, 3)]
    out.ack_ranges = False
    out.ack(0, 7, 0)
    out.ack(0, 8)
    assert [(i.offset, epoch(i)) for i in next(it).ack.ids] == [(7, 0), (8, None)]


def test_ack_ranges_merge_runs_and_repeats() -> None:
    assert ack_ranges([(0, 5), (0, 3), (1, 9), (0, 4), (0, 7)]) == {0: [3, 6, 7, 8], 1: [9, 10]}
    assert ack_ranges([(0, 1), (0, 1), (0, 2)]) == {0: [1, 3]}


def test_messages_of_forwarded_batches_read_fields_lazily() -> None:
    b = BatchBuilder()
    b.append(b"v0", b"k0", "a", {"h": b"1"}, 1_000)
    b.append(b"v1", None, None, None, 1_005)
    b.append(b"v2", b"k2", "b", None, 1_010)
    raw = bytearray(b.build())
    stamp(raw, 0, 40, 1, 0)
    view = BatchView(bytes(raw))
    cut = view.cut([(0, 1), (2, 3)])  # what a consumer given offsets 40 and 42 gets
    batch = pb.MessageBatch(topic="t")
    batch.batches.add(partition=3, records=cut, redelivery_counts=[0, 2])
    batch.batches.add(partition=3, records=bytes(raw))
    session = object()
    msgs = messages_of(batch, "t", session)
    assert [(m.partition, m.offset, m.redelivery_count) for m in msgs] == [
        (3, 40, 0),
        (3, 42, 2),
        (3, 40, 0),
        (3, 41, 0),
        (3, 42, 0),
    ]
    first, second = msgs[0], msgs[1]
    assert (first.key, first.value, first.tag, first.headers, first.timestamp) == (
        b"k0",
        b"v0",
        "a",
        {"h": b"1"},
        1_000,
    )
    assert (second.key, second.value, second.tag, second.headers, second.timestamp) == (
        b"k2",
        b"v2",
        "b",
        {},
        1_010,
    )
    assert msgs[3].key is None
    assert msgs[3].tag is None
    assert all(m._session is session for m in msgs)


def test_ack_group_time_setting() -> None:
    assert PushConsumerConfig().ack_group_time == timedelta(milliseconds=2)
    assert PushConsumerConfig().replace(ack_group_time="50ms").ack_group_time == timedelta(milliseconds=50)
    assert PushConsumerConfig().replace(ack_group_time=0).ack_group_time == timedelta(0)
    for bad in ("61s", -1, "soon"):
        with pytest.raises(InvalidArgument, match="ack_group_time"):
            PushConsumerConfig().replace(ack_group_time=bad)


def test_outbound_group_time_holds_acks_until_it_ends() -> None:
    """A lone ack waits out the group time (here 0.3 s); with 0 it leaves as soon as the writer is free."""
    for group, at_least, at_most in ((0.3, 0.25, 5.0), (0.0, 0.0, 0.2)):
        out = Outbound(pb.Subscribe(), ack_group_time=group)
        it = iter(out)
        next(it)  # subscribe
        got: list[float] = []

        def write(it: Iterator[pb.ConsumerCommand] = it, got: list[float] = got) -> None:
            next(it)
            got.append(time.monotonic())

        t = threading.Thread(target=write)
        t.start()
        time.sleep(0.05)  # the writer is waiting for work
        start = time.monotonic()
        out.ack(0, 7)
        t.join(10)
        assert got, "the ack was never written"
        assert at_least <= got[0] - start <= at_most, (group, got[0] - start)
        out.close()
