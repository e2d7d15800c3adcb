"""The Key_Shared pass over the read-ahead filed by owner (``keyindex.py``) against the plain scan.

The plain scan (the pass before session 15's index, kept here as the reference) walks a partition's
whole read-ahead in offset order at every pass. Two subscriptions run the same random steps (reads on
two partitions, consumers joining with and without partition restrictions, sticky ranges that leave
hashes unowned, Flow, acks, nacks with delays, durable cursors whose gate holds messages back, and
parking with its DLQ), one with the index and one with the plain scan; after every step they must
agree on what every consumer received (partition, offset, count, in order), what went to the DLQ,
what waits in each partition's read-ahead and its bytes, and what is in flight where.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.dispatcher import selectors
from sluice.dispatcher.consumer import Consumer
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.keyshared import key_hash
from sluice.dispatcher.messages import Message
from sluice.dispatcher.model import SubscriptionType
from sluice.dispatcher.partition_state import PartitionState
from tests.unit.dispatcher.context import Ctx

CONSUMERS = ("a", "b", "c")
KEYS = [f"key-{i}".encode() for i in range(12)]
POISON_HASH = key_hash(KEYS[0])
#: Sticky ranges that leave hashes nobody owns (their messages wait).
STICKY = {"a": ((0, 20000),), "b": ((20001, 40000),), "c": ((50000, 65535),)}


def plain_take_pending(
    self: Any, ps: PartitionState, out: dict[Consumer, list[Message]]
) -> None:  # pragma: no cover - the reference
    """The pass before the index: the whole read-ahead, in offset order, at every pass."""
    caps, p = self.caps, ps.partition
    kept: deque[Message] = deque()
    taken_bytes = 0
    pending = ps.pending
    gate = ps.cursor.gate
    parking = self.parking
    parked = parking.hashes if parking is not None else ()
    parked_bytes = 0
    for i, m in enumerate(pending):
        if m.offset >= gate:
            ps.cursor.stall(m.offset)
            kept.extend(islice(pending, i, None))
            break
        if m.key_hash in parked and parking is not None and parking.take(m):
            parked_bytes += m.size
            continue
        c = self.eligible(m, p)
        if c is None:
            kept.append(m)
            continue
        out.setdefault(c, []).append(m)
        taken_bytes += m.size
        caps[c] -= 1
        if not caps[c] and not any(caps.values()):
            kept.extend(islice(pending, i + 1, None))
            break
    ps.pending = kept
    ps.pending_bytes -= taken_bytes + parked_bytes


@contextmanager
def plain_scan() -> Iterator[None]:
    indexed = selectors._KeySharedPass.take_pending
    selectors._KeySharedPass.take_pending = plain_take_pending  # type: ignore[method-assign]
    try:
        yield
    finally:
        selectors._KeySharedPass.take_pending = indexed  # type: ignore[method-assign]


op = st.one_of(
    st.tuples(
        st.just("read"), st.sampled_from([0, 1]), st.lists(st.integers(0, 11), min_size=1, max_size=30)
    ),
    st.tuples(
        st.just("join"),
        st.sampled_from(CONSUMERS),
        st.integers(0, 25),
        st.sampled_from([None, None, None, frozenset({0}), frozenset({1})]),
        st.sampled_from([0, 0, 6]),
    ),
    st.tuples(st.just("leave"), st.sampled_from(CONSUMERS)),
    st.tuples(st.just("flow"), st.sampled_from(CONSUMERS), st.integers(1, 30)),
    st.tuples(st.just("ack"), st.sampled_from(CONSUMERS), st.sampled_from([1.0, 0.5, 0.2])),
    st.tuples(st.just("nack"), st.sampled_from(CONSUMERS), st.sampled_from([1.0, 0.3])),
    st.tuples(
        st.just("fail_poison"),
    ),
    st.tuples(st.just("advance"), st.integers(1, 40)),
    st.tuples(
        st.just("save"),
    ),
)


def _held(ctx: Ctx, cid: str, frac: float, poison_only: bool = False) -> list[tuple[int, int]]:
    c = ctx.sub.consumers.get(cid)
    if c is None or c is not ctx.consumers.get(cid):
        return []
    ids = sorted(
        (p, o)
        for p, msgs in c.inflight.items()
        for o, m in msgs.items()
        if not poison_only or m.key_hash == POISON_HASH
    )
    return ids[: max(1, int(len(ids) * frac))] if ids else []


def step(ctx: Ctx, o: tuple[Any, ...], sticky: bool) -> None:
    kind = o[0]
    if kind == "read":
        ctx.produce(o[1], keys=[KEYS[k] for k in o[2]])
    elif kind == "join":
        _, cid, permits, parts, max_unacked = o
        ranges = STICKY[cid] if sticky else None
        ctx.join(
            cid, permits, partitions=parts, max_unacked=max_unacked, nack_delay_ms=10,
            max_redeliver=3, sticky_ranges=ranges,
        )  # fmt: skip
    elif kind == "leave":
        if ctx.consumers.get(o[1]) is ctx.sub.consumers.get(o[1]) is not None:
            ctx.leave(o[1])
    elif kind == "flow":
        if o[1] in ctx.sub.consumers:
            ctx.flow(o[1], o[2])
    elif kind == "ack":
        ids = _held(ctx, o[1], o[2])
        if ids:
            assert not ctx.ack(o[1], ids)
    elif kind == "nack":
        ids = _held(ctx, o[1], o[2])
        if ids:
            assert not ctx.nack(o[1], ids)
    elif kind == "fail_poison":
        for cid in CONSUMERS:
            ids = _held(ctx, cid, 1.0, poison_only=True)
            if ids:
                assert not ctx.nack(cid, ids)
    elif kind == "advance":
        ctx.advance(o[1])
    elif kind == "save":
        for ps in ctx.sub.partitions.values():
            snap = ps.cursor.snapshot()
            ps.cursor.mark_saved(snap.version, snap.delivered_up_to)
        ctx.apply(ctx.sub.cursors_saved(ctx.now))


def waiting(ps: PartitionState) -> list[int]:
    filed = [m.offset for q in ps.keyed.queues.values() for m in q] if ps.keyed is not None else []
    return sorted([m.offset for m in ps.pending] + filed)


def state(ctx: Ctx) -> dict[str, Any]:
    """What must agree. With parking, where a parked key's next message waits may differ: the plain scan
    parks it when it passes it, the index only once none of its key is still filed ahead of it (else
    the key's dead letters could leave out of order), so the read-ahead and parking are compared
    together."""
    sub = ctx.sub
    parked = [(m.partition, m.offset) for m in sub.parking.messages()]
    parts = {
        p: (
            sorted(set(waiting(ps)) | {o for q, o in parked if q == p}),
            ps.unacked_messages() if not sub.parking.on else None,
            ps.pending_bytes if not sub.parking.on else None,
            sorted(ps.replay),
            sorted(ps.delayed),
            {o: c.consumer_id for o, c in ps.inflight.items()},
        )
        for p, ps in sub.partitions.items()
    }
    return {"received": dict(ctx.received), "dead": list(ctx.dead), "parts": parts}


def make(durable: bool, sticky: bool, park: bool) -> Ctx:
    cursors = {p: PartitionCursor(p, persisted=True) for p in (0, 1)} if durable else None
    ctx = Ctx(SubscriptionType.KEY_SHARED, partitions=(0, 1), sticky=sticky, cursors=cursors)
    if park:
        ctx.settings = dataclasses.replace(ctx.settings, park_after=2, park_max_messages=40)
    return ctx


@settings(max_examples=200, deadline=None)
@given(
    st.lists(op, min_size=10, max_size=80),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_indexed_pass_agrees_with_the_plain_scan(
    ops: list[tuple[Any, ...]], durable: bool, sticky: bool, park: bool
) -> None:
    indexed, plain = make(durable, sticky, park), make(durable, sticky, park)
    # Two consumers from the start, so that most steps pass something (a pass needs capacity).
    start: list[tuple[Any, ...]] = [("join", "a", 10, None, 0), ("join", "b", 10, None, 6)]
    for o in start + ops:
        step(indexed, o, sticky)
        with plain_scan():
            step(plain, o, sticky)
        assert state(indexed) == state(plain), o
        filed_in_order(indexed)


def filed_in_order(ctx: Ctx) -> None:
    """The index's invariants (``keyindex.py``): each queue in offset order and under its key's current
    owner, all of it before what is still unfiled, and its count exact."""
    table = ctx.sub.owner_table
    for ps in ctx.sub.partitions.values():
        if ps.keyed is None:
            continue
        first_unfiled = ps.pending[0].offset if ps.pending else None
        for owner, q in ps.keyed.queues.items():
            offsets = [m.offset for m in q]
            assert offsets == sorted(offsets)
            assert all(table[m.key_hash] is owner for m in q)
            assert first_unfiled is None or not offsets or offsets[-1] < first_unfiled
        assert len(ps.keyed) == sum(map(len, ps.keyed.queues.values()))


def test_the_plain_scan_is_really_swapped_in() -> None:
    """The reference is what runs under ``plain_scan`` (else the test above compares the index to itself)."""
    ctx = make(False, False, False)
    with plain_scan():
        ctx.join("a", 5)
        ctx.produce(0, keys=KEYS[:3])
    assert ctx.sub.partitions[0].keyed is None
    ctx.produce(0, keys=KEYS[:3])
    assert ctx.sub.partitions[0].keyed is not None


def test_a_key_parked_while_its_messages_are_filed_goes_to_the_dlq_in_order() -> None:
    """Messages of a key filed under a consumer with no capacity left, then the key parks: a later read
    of the key must not go to parking ahead of them, or past the cap the key's dead letters leave out
    of order (``bench/poison_keys.py`` caught it: ``[0, 3, 4, 1, 2]``)."""
    ctx = make(False, False, True)
    ctx.settings = dataclasses.replace(ctx.settings, park_after=1, park_max_messages=1)
    poison = KEYS[0]
    ctx.join("a", 0, max_redeliver=1, nack_delay_ms=100)
    ctx.join("b", 0, max_redeliver=1, nack_delay_ms=100)
    owner = ctx.sub.owner_table[key_hash(poison)]
    assert owner is not None
    other_id = "b" if owner.consumer_id == "a" else "a"
    other_key = next(k for k in KEYS if ctx.sub.owner_table[key_hash(k)] is ctx.consumers[other_id])
    ctx.flow(owner.consumer_id, 1)
    first = ctx.produce(0, keys=[poison, poison, poison])
    assert [o for _, o, _ in ctx.take(owner.consumer_id)] == first[:1]
    assert not ctx.nack(owner.consumer_id, [(0, first[0])])  # parks the key; its owner has no permit
    ctx.flow(other_id, 5)  # a pass runs (another consumer has capacity) and files the next read
    later = ctx.produce(0, keys=[poison, poison, other_key])
    failing = {(0, o) for o in first + later[:2]}
    for _ in range(20):
        ctx.flow(owner.consumer_id, 5)
        for cid in ("a", "b"):
            got = [(p, o) for p, o, _ in ctx.take(cid)]
            bad = [i for i in got if i in failing]
            good = [i for i in got if i not in failing]
            assert not (bad and ctx.nack(cid, bad))
            assert not (good and ctx.ack(cid, good))
        ctx.advance(200)
    assert [o for _, o, _ in ctx.dead] == first + later[:2]


def test_emptied_queues_are_given_back() -> None:
    """An idle partition keeps no queue per owner (``PartitionState.give_back``, as for ``pending``)."""
    ctx = make(False, False, False)
    ctx.join("a", 1)
    ctx.join("b", 1)
    ctx.produce(0, keys=KEYS)
    ps = ctx.sub.partitions[0]
    assert ps.keyed is not None
    assert len(ps.keyed.queues) == 2
    ctx.sub.give_back_memory()
    assert len(ps.keyed.queues) == 2  # still filled: kept
    ctx.flow("a", 100)
    ctx.flow("b", 100)
    assert not ps.keyed
    ctx.sub.give_back_memory()
    assert ps.keyed.queues == {}
