"""Key_Shared poison isolation (``parking.py``): a failing key parks, the others flow, the DLQ gets it
in order."""

from __future__ import annotations

import dataclasses

import pytest

from sluice.dispatcher.config import DispatcherConfig
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.keyshared import key_hash
from sluice.dispatcher.model import SubscriptionType
from sluice.dispatcher.parking import PROBE_IDLE_MS, ParkState
from sluice.dispatcher.requests import SubscribeRequest, consumer_spec
from sluice.errors import InvalidArgument
from tests.unit.dispatcher.context import Ctx

T = SubscriptionType
POISON = b"poison"


def make(park_after: int = 2, hold: bool = False, cap: int = 10_000, read_ahead: int = 1 << 30) -> Ctx:
    ctx = Ctx(T.KEY_SHARED, read_ahead_bytes=read_ahead)
    ctx.settings = dataclasses.replace(
        ctx.settings, park_after=park_after, park_hold=hold, park_max_messages=cap
    )
    return ctx


def keys_for(n: int, poison_every: int) -> list[bytes]:
    """``n`` keys: every ``poison_every``-th is the poison key, the others cycle over 50 good keys."""
    return [POISON if i % poison_every == 0 else f"k{i % 50}".encode() for i in range(n)]


def run(
    ctx: Ctx, total: int, poison_every: int, rounds: int, fail: set[bytes]
) -> tuple[list[int], list[int]]:
    """Produce while the subscription wants; the consumers ack good keys and nack failing ones. Returns
    the good offsets acknowledged and the poison offsets delivered, in delivery order."""
    keys = keys_for(total, poison_every)
    key_at: dict[int, bytes] = {}
    produced = 0
    acked: list[int] = []
    poison_seen: list[int] = []
    for _ in range(rounds):
        while produced < total and ctx.sub.wants(0):
            chunk = keys[produced : produced + 20]
            for o, k in zip(ctx.produce(0, len(chunk), keys=chunk), chunk, strict=True):
                key_at[o] = k
            produced += len(chunk)
        for cid in list(ctx.consumers):
            got = ctx.take(cid)
            bad = [(p, o) for p, o, _ in got if key_at[o] in fail]
            good = [(p, o) for p, o, _ in got if key_at[o] not in fail]
            poison_seen += [o for _, o in bad]
            if good:
                assert not ctx.ack(cid, good)
                acked += [o for _, o in good]
            if bad:
                assert not ctx.nack(cid, bad)
            ctx.flow(cid, max(len(got), 1))
        ctx.advance(50)
    return acked, poison_seen


def test_poison_key_parks_others_flow_and_dlq_is_in_order() -> None:
    # Read-ahead of ~30 messages: without parking the poison key's waiting messages fill it (below).
    ctx = make(park_after=2, read_ahead=3000)
    for cid in ("a", "b"):
        ctx.join(cid, permits=100, max_redeliver=3, nack_delay_ms=100)
    acked, _ = run(ctx, total=2000, poison_every=7, rounds=400, fail={POISON})
    good_total = sum(1 for k in keys_for(2000, 7) if k != POISON)
    assert len(acked) == good_total
    assert len(set(acked)) == good_total
    poison = [o for o, k in enumerate(keys_for(2000, 7)) if k == POISON]
    dead = [o for _, o, _ in ctx.dead]
    assert dead == poison  # every poison message, once, in order
    assert ctx.sub.parking.waiting_total == 0
    ctx.advance(PROBE_IDLE_MS)  # a probing key with nothing more to try is forgotten
    assert not ctx.sub.parking.keys
    assert all(n >= 0 for _, _, n in ctx.dead)


def test_parking_spares_the_consumers_the_poison_keys_redeliveries() -> None:
    """Without parking every poison message is delivered 1 + max_redeliver times, taking the good keys'
    capacity; parked, only the head is retried and the rest goes to the DLQ behind it, in order."""
    deliveries: dict[int, int] = {}
    for park_after in (0, 2):
        ctx = make(park_after=park_after)
        for cid in ("a", "b"):
            ctx.join(cid, permits=100, max_redeliver=3, nack_delay_ms=100)
        _, seen = run(ctx, total=2000, poison_every=7, rounds=400, fail={POISON})
        deliveries[park_after] = len(seen)
        assert sorted(o for _, o, _ in ctx.dead) == [
            o for o, k in enumerate(keys_for(2000, 7)) if k == POISON
        ]
    poison = sum(1 for k in keys_for(2000, 7) if k == POISON)
    assert deliveries[0] == 4 * poison
    assert deliveries[2] < 2 * poison


def test_head_acked_releases_waiting_messages_in_order() -> None:
    ctx = make(park_after=1)
    ctx.join("a", permits=1000, max_redeliver=10, nack_delay_ms=100)
    offs = ctx.produce(0, 6, keys=[POISON, b"x", POISON, POISON, b"y", POISON])
    assert [o for _, o, _ in ctx.take("a")] == offs
    assert not ctx.ack("a", [(0, offs[1]), (0, offs[4])])
    assert not ctx.nack("a", [(0, offs[0]), (0, offs[2]), (0, offs[3]), (0, offs[5])])
    pk = ctx.sub.parking.keys[POISON]  # the first to come back is the head; the others wait
    assert pk.head == (0, offs[0])
    assert [m.offset for m in pk.waiting] == [offs[2], offs[3], offs[5]]
    more = ctx.produce(0, 2, keys=[POISON, b"z"])
    assert [o for _, o, _ in ctx.take("a")] == [more[1]]  # a later poison message waits too
    ctx.advance(150)
    assert [(o, n) for _, o, n in ctx.take("a")] == [(offs[0], 1)]  # only the head is retried
    assert ctx.sub.parking.waiting_total == 4
    assert not ctx.ack("a", [(0, offs[0])])  # the head succeeded: the key is released, in order
    assert not ctx.sub.parking.keys
    assert [o for _, o, _ in ctx.take("a")] == [offs[2], offs[3], offs[5], more[0]]


def test_hold_policy_keeps_the_key_until_unpark_with_fresh_counts() -> None:
    ctx = make(park_after=1, hold=True)
    ctx.join("a", permits=1000, max_redeliver=2, nack_delay_ms=10)
    offs = ctx.produce(0, 3, keys=[POISON, POISON, b"x"])
    for _ in range(3):
        got = ctx.take("a")
        ctx.nack("a", [(p, o) for p, o, _ in got if o != offs[2]])
        ctx.ack("a", [(p, o) for p, o, _ in got if o == offs[2]])
        ctx.advance(20)
    pk = ctx.sub.parking.keys[POISON]
    assert pk.state == ParkState.HELD
    assert [m.offset for m in pk.waiting] == offs[:2]
    assert not ctx.dead
    ctx.advance(10_000)
    assert not ctx.take("a")  # held: nothing is retried, nothing dead-lettered
    assert not ctx.dead
    ctx.apply(ctx.sub.unpark(POISON, ctx.now))
    assert not ctx.sub.parking.keys
    assert [(o, n) for _, o, n in ctx.take("a")] == [(offs[0], 0), (offs[1], 0)]


def test_key_past_the_cap_goes_to_the_dlq_in_order() -> None:
    ctx = make(park_after=1, hold=True, cap=5)
    ctx.join("a", permits=1000, max_redeliver=100, nack_delay_ms=1000)
    first = ctx.produce(0, 1, keys=[POISON])
    ctx.take("a")
    ctx.nack("a", [(0, first[0])])
    rest = ctx.produce(0, 10, keys=[POISON] * 10)
    ctx.flow("a", 1)  # a dispatch pass parks them, finds the key past its cap, and settles it
    assert [o for _, o, _ in ctx.dead] == first + rest  # head first, in order
    pk = ctx.sub.parking.keys[POISON]  # the key probes: its next message is tried alone
    assert pk.head is None
    assert not pk.waiting
    nxt = ctx.produce(0, 3, keys=[POISON, POISON, b"x"])
    assert [o for _, o, _ in ctx.take("a")] == [nxt[0], nxt[2]]
    assert not ctx.ack("a", [(0, nxt[0])])  # it succeeds: the key is released
    assert not ctx.sub.parking.keys
    assert [o for _, o, _ in ctx.take("a")] == [nxt[1]]


def test_consumers_leaving_return_parked_keys_messages_to_the_parking() -> None:
    ctx = make(park_after=1)
    ctx.join("a", permits=1000, max_redeliver=5, nack_delay_ms=100)
    offs = ctx.produce(0, 4, keys=[POISON] * 4)
    ctx.take("a")
    ctx.nack("a", [(0, offs[0])])  # head parks the key; 1..3 are still in flight at a
    ctx.leave("a")
    assert [m.offset for m in ctx.sub.parking.keys[POISON].waiting] == offs[1:]
    ctx.join("b", permits=1000, max_redeliver=5, nack_delay_ms=100)
    ctx.advance(150)
    assert [o for _, o, _ in ctx.take("b")] == [offs[0]]


def test_a_restart_keeps_a_held_key_held() -> None:
    """After a restart the cursor brings back the head's persisted count: past max_redeliver under the
    hold policy it is held again at once (not dead-lettered), and the key's later messages behind it."""
    cursor = PartitionCursor(0, redeliveries={0: 3})
    ctx = Ctx(T.KEY_SHARED, cursors={0: cursor})
    ctx.settings = dataclasses.replace(ctx.settings, park_after=1, park_hold=True)
    ctx.join("a", permits=100, max_redeliver=2, nack_delay_ms=10)
    offs = ctx.produce(0, 4, keys=[POISON, POISON, b"x", POISON])
    assert [o for _, o, _ in ctx.take("a")] == [offs[2]]
    assert not ctx.dead
    pk = ctx.sub.parking.keys[POISON]
    assert pk.state == ParkState.HELD
    assert [m.offset for m in pk.waiting] == [offs[0], offs[1], offs[3]]


@pytest.mark.parametrize(
    ("overrides", "text"),
    [
        ({"type": int(T.SHARED), "park_after": 2}, "need a key_shared subscription"),
        ({"type": int(T.KEY_SHARED), "park_after": -1}, "park_after must be >= 0"),
        (
            {"type": int(T.KEY_SHARED), "park_after": 1, "park_max_messages": -5},
            "park_max_messages must be >= 0",
        ),
    ],
)
def test_bad_park_settings_are_refused(overrides: dict[str, int], text: str) -> None:
    req = SubscribeRequest(topic="t", subscription="s", **overrides)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=text):
        consumer_spec(req, DispatcherConfig(coordinator="127.0.0.1:1"))


def test_park_settings_reach_the_subscription() -> None:
    req = SubscribeRequest(topic="t", subscription="s", type=int(T.KEY_SHARED), park_after=2, park_hold=True)
    _, settings = consumer_spec(req, DispatcherConfig(coordinator="127.0.0.1:1"))
    assert (settings.park_after, settings.park_hold, settings.park_max_messages) == (2, True, 10_000)


def test_a_busy_key_sharing_the_hash_does_not_keep_the_parked_key_from_the_dlq() -> None:
    twin = next(k for i in range(1_000_000) if key_hash(k := f"twin-{i}".encode()) == key_hash(POISON))
    ctx = make(park_after=1, cap=3)
    ctx.join("a", permits=1000, max_redeliver=100, nack_delay_ms=1000)
    first = ctx.produce(0, 2, keys=[POISON, twin])
    ctx.take("a")
    ctx.nack("a", [(0, first[0])])  # parked; the twin stays in flight (never acknowledged)
    rest = ctx.produce(0, 5, keys=[POISON] * 5)
    ctx.flow("a", 1)
    assert [o for _, o, _ in ctx.dead] == [first[0], *rest]
