"""Key_Shared parking with its store (``parking.py``, ``parkstore.py``, ``parkrestore.py``): what parks is
written to the store, then acknowledged on the cursor; a restart replays the store (``ParkBook``, shared
with the pull side) and keeps the parking, in order, without parking anything twice."""

from __future__ import annotations

import dataclasses

import pytest

from sluice.client.push.config import PushConsumerConfig
from sluice.dispatcher.config import DispatcherConfig
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.keyshared import key_hash
from sluice.dispatcher.model import SubscriptionType
from sluice.dispatcher.parking import ParkState
from sluice.dispatcher.parkrestore import restore
from sluice.dispatcher.parkstore import event_record
from sluice.dispatcher.requests import SubscribeRequest, consumer_spec
from sluice.errors import InvalidArgument
from sluice.retry.parkbook import ParkBook
from tests.unit.dispatcher.context import Ctx

T = SubscriptionType
POISON = b"poison"
WALL = 1_700_000_000_000


def make(
    hold: bool = False, cap: int = 10_000, byte_cap: int = 1 << 30, cursor: PartitionCursor | None = None
) -> Ctx:
    ctx = Ctx(T.KEY_SHARED, cursors={0: cursor} if cursor is not None else None)
    ctx.settings = dataclasses.replace(
        ctx.settings, park_after=1, park_hold=hold, park_max_messages=cap, park_max_bytes=byte_cap
    )
    return ctx


def book_of(ctx: Ctx, upto: int | None = None) -> ParkBook:
    """What a replay of the store reads: the events written so far (``upto``: only the first ones)."""
    book = ParkBook()
    for i, e in enumerate(ctx.park_log[:upto]):
        book.apply(event_record("t", e, WALL + i)._replace(topic="t.s.PARK", offset=i))
    return book


def park_poison(ctx: Ctx, limit: int = 5) -> list[int]:
    """Records P x P P; x acknowledged; the first P nacked (the key parks), the other two nacked behind it."""
    ctx.join("a", permits=100, max_redeliver=limit, nack_delay_ms=100)
    offs = ctx.produce(0, 4, keys=[POISON, b"x", POISON, POISON])
    assert [o for _, o, _ in ctx.take("a")] == offs
    assert not ctx.ack("a", [(0, offs[1])])
    assert not ctx.nack("a", [(0, offs[0])])
    assert not ctx.nack("a", [(0, offs[2]), (0, offs[3])])
    return offs


def test_the_cursor_acknowledges_parked_messages_once_the_store_holds_them() -> None:
    ctx = make()
    ctx.auto_park = False
    offs = park_poison(ctx)
    cursor = ctx.sub.partitions[0].cursor
    assert [(e.op, e.offset) for e in ctx.park_log] == [("park", o) for o in (offs[0], offs[2], offs[3])]
    assert cursor.mark_delete == 0  # not before the store acknowledged them: a crash loses nothing
    ctx.save_parks()
    assert cursor.mark_delete == offs[3] + 1  # past every parked message: retention may delete them
    assert ctx.sub.parking.keys[POISON].state == ParkState.PARKED
    ctx.advance(150)
    assert [(o, n) for _, o, n in ctx.take("a")] == [(offs[0], 1)]  # the head, counted by parking
    assert not ctx.ack("a", [(0, offs[0])])
    assert [o for _, o, _ in ctx.take("a")] == [offs[2], offs[3]]  # released in order
    assert book_of(ctx).keys  # still in the store until acknowledged
    assert not ctx.ack("a", [(0, offs[2]), (0, offs[3])])
    ctx.flow("a", 1)
    assert not book_of(ctx).keys  # all resolved: the store is empty again
    assert not ctx.sub.parking.stored


def test_a_restart_replays_the_store_in_order_and_parks_nothing_twice() -> None:
    """A kill -9 after the park writes and before the cursor's acknowledgement reached the offset store:
    the new dispatcher's cursor has nothing acknowledged. The replayed store parks the key at once (listed
    before any record is read), the log's copies of the parked records are neither parked nor delivered
    again, and the key's order holds: head, the parked records, then the later ones."""
    first = make()
    offs = park_poison(first)
    events = len(first.park_log)
    ctx = make(cursor=PartitionCursor(0))  # the persisted cursor: nothing acknowledged
    ctx.join("b", permits=100, max_redeliver=5, nack_delay_ms=100)
    assert restore(ctx.sub, book_of(first, events), "t", 5, ctx.now, WALL + 10) == 1
    pk = ctx.sub.parking.keys[POISON]
    assert pk.head == (0, offs[0])
    assert [m.offset for m in pk.waiting] == [offs[2], offs[3]]
    assert ctx.sub.partitions[0].cursor.is_acked(offs[2])
    # The log is read again from the start, plus a later record of the key.
    again = ctx.produce(0, 5, keys=[POISON, b"x", POISON, POISON, POISON])
    assert again[:4] == offs
    head = ctx.messages["b"][0].record
    got = ctx.take("b")
    assert [(o, n) for _, o, n in got] == [(offs[0], 1), (offs[1], 0)]  # head (count kept), and x again
    assert (head.key, head.value, head.offset) == (POISON, b"v0", offs[0])  # the record from the store
    assert [m.offset for m in pk.waiting] == [offs[2], offs[3], again[4]]
    assert not ctx.ack("b", [(0, o) for _, o, _ in got])
    assert [o for _, o, _ in ctx.take("b")] == [offs[2], offs[3], again[4]]
    parks = [e.offset for e in ctx.park_log if e.op == "park"]
    assert parks == [again[4]]  # only the new one: nothing parked twice


def test_a_restart_keeps_a_held_key_held_from_the_store() -> None:
    first = make(hold=True)
    offs = park_poison(first, limit=1)
    first.advance(150)
    first.nack("a", [(0, offs[0])])  # the head's second failure: past max_redeliver 1, held
    assert first.sub.parking.keys[POISON].state == ParkState.HELD
    assert first.sub.partitions[0].cursor.mark_delete == offs[3] + 1
    ctx = make(hold=True, cursor=PartitionCursor(0, mark_delete=offs[3] + 1))
    ctx.join("b", permits=100, max_redeliver=1, nack_delay_ms=100)
    restore(ctx.sub, book_of(first), "t", 1, ctx.now, WALL + 10)
    pk = ctx.sub.parking.keys[POISON]
    assert pk.state == ParkState.HELD
    assert [m.offset for m in pk.waiting] == [offs[0], offs[2], offs[3]]
    assert not ctx.take("b")
    ctx.apply(ctx.sub.unpark(POISON, ctx.now))  # the operator: all of it again, in order, counted from 0
    assert [(o, n) for _, o, n in ctx.take("b")] == [(offs[0], 0), (offs[2], 0), (offs[3], 0)]
    assert ctx.park_log[-1].op == "unpark"


def test_the_dlq_takes_the_stored_messages_in_order_and_resolves_them() -> None:
    ctx = make()
    offs = park_poison(ctx, limit=1)
    ctx.advance(150)
    ctx.take("a")
    ctx.nack("a", [(0, offs[0])])
    assert [o for _, o, _ in ctx.dead] == [offs[0], offs[2], offs[3]]
    assert [e.how for e in ctx.park_log if e.op == "resolved"] == ["dlq"]
    assert not book_of(ctx).keys


def test_past_the_byte_cap_the_largest_key_goes_to_the_dlq() -> None:
    ctx = make(byte_cap=1)  # every parked byte is past the cap
    offs = park_poison(ctx)
    ctx.flow("a", 1)
    assert [o for _, o, _ in ctx.dead] == [offs[0], offs[2], offs[3]]
    assert ctx.sub.parking.bytes_total == 0
    assert not book_of(ctx).keys


def test_the_byte_cap_reaches_the_subscription_and_is_checked() -> None:
    base = {"topic": "t", "subscription": "s", "type": int(T.KEY_SHARED), "park_after": 1}
    cfg = DispatcherConfig(coordinator="127.0.0.1:1")
    _, settings = consumer_spec(SubscribeRequest(**base, park_max_bytes=1000), cfg)  # type: ignore[arg-type]
    assert settings.park_max_bytes == 1000
    _, settings = consumer_spec(SubscribeRequest(**base), cfg)  # type: ignore[arg-type]
    assert settings.park_max_bytes == 64 * 1024 * 1024
    with pytest.raises(InvalidArgument, match="park_max_bytes must be >= 0"):
        consumer_spec(SubscribeRequest(**base, park_max_bytes=-1), cfg)  # type: ignore[arg-type]
    sub = PushConsumerConfig(park_max_bytes=1000).to_subscribe("t", "s", "key_shared", "c", "c", [])
    assert sub.park_max_bytes == 1000


def test_a_probing_head_waiting_in_the_read_ahead_keeps_its_key_parked() -> None:
    """A probing key's next message is stored as its head when a dispatch pass sees it, but may stay in the
    read-ahead (its hash's owner has no capacity). The cursor acknowledged it (stored); the key must stay
    parked until it is really acknowledged, or the messages behind it would overtake it."""
    ctx = make(cap=1)
    ctx.join("a", max_redeliver=100, nack_delay_ms=1000)
    ctx.join("b", max_redeliver=100, nack_delay_ms=1000)
    owner_c = ctx.sub.owner_table[key_hash(POISON)]
    assert owner_c is not None
    owner = owner_c.consumer_id
    other = "b" if owner == "a" else "a"
    ctx.flow(owner, 1)
    first = ctx.produce(0, 1, keys=[POISON])
    assert [o for _, o, _ in ctx.take(owner)] == first
    ctx.nack(owner, [(0, first[0])])  # parked
    rest = ctx.produce(0, 3, keys=[POISON] * 3)
    ctx.flow(other, 1)  # past the cap (1): the key goes to the DLQ, then probes
    assert [o for _, o, _ in ctx.dead] == first + rest
    nxt = ctx.produce(0, 2, keys=[POISON, POISON])  # the owner has no capacity: both wait
    ctx.flow(other, 1)
    pk = ctx.sub.parking.keys[POISON]
    assert pk.head == (0, nxt[0])
    assert [m.offset for m in pk.waiting] == [nxt[1]]
    ctx.flow(owner, 10)
    assert [o for _, o, _ in ctx.take(owner)] == [nxt[0]]  # the head alone, not the one behind it
