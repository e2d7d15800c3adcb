"""Key_Shared: hash ranges, per-key order across joins and leaves, draining only in-flight hashes."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from sluice.dispatcher.keyshared import AutoSplitRanges, StickyRanges, key_hash, parse_sticky_ranges
from sluice.dispatcher.model import SubscriptionType
from sluice.errors import ConsumerBusy, InvalidArgument
from tests.unit.dispatcher.context import Ctx

T = SubscriptionType


def keys_in(lo: int, hi: int, n: int) -> list[bytes]:
    out: list[bytes] = []
    i = 0
    while len(out) < n:
        k = f"key-{i}".encode()
        if lo <= key_hash(k) <= hi:
            out.append(k)
        i += 1
    return out


def test_auto_split_worked_example() -> None:
    r = AutoSplitRanges()
    r.add("A")
    assert r.ranges() == [(0, 65535, "A")]
    r.add("B")
    assert r.ranges() == [(0, 32767, "A"), (32768, 65535, "B")]
    r.add("C")
    assert r.ranges() == [(0, 16383, "A"), (16384, 32767, "C"), (32768, 65535, "B")]
    r.remove("C")
    assert r.ranges() == [(0, 16383, "A"), (16384, 65535, "B")]
    r.remove("B")
    assert r.ranges() == [(0, 65535, "A")]
    table = r.owner_table()
    assert len(table) == 65536
    assert set(table) == {"A"}


def test_sticky_ranges_refuse_overlaps_and_bad_input() -> None:
    s = StickyRanges()
    s.add("A", parse_sticky_ranges([0, 999, 5000, 5999]))
    with pytest.raises(ConsumerBusy):
        s.add("B", parse_sticky_ranges([900, 1100]))
    with pytest.raises(ConsumerBusy):
        s.add("B", parse_sticky_ranges([4000, 7000]))  # swallows A's second range
    s.add("B", parse_sticky_ranges([1000, 4999]))
    for bad in ([], [1], [5, 4], [0, 70000], [0, 10, 5, 20]):
        with pytest.raises(InvalidArgument):
            parse_sticky_ranges(bad)


def test_key_goes_to_its_owner_and_unowned_sticky_hashes_wait() -> None:
    ctx = Ctx(T.KEY_SHARED, sticky=True)
    low, high = keys_in(0, 32767, 1)[0], keys_in(32768, 65535, 1)[0]
    ctx.join("a", permits=100, sticky_ranges=((0, 32767),))
    ctx.produce(0, 4, keys=[low, high, low, high])
    assert ctx.offsets("a") == [0, 2]
    ctx.join("b", permits=100, sticky_ranges=((32768, 65535),))
    assert ctx.offsets("b") == [1, 3]


def test_joining_consumer_drains_only_hashes_in_flight() -> None:
    ctx = Ctx(T.KEY_SHARED)
    held, free = keys_in(40000, 65535, 2)  # both move to the second consumer when it joins
    ctx.join("a", permits=100)
    ctx.produce(0, 2, keys=[held, free])
    ctx.ack("a", [(0, 1)])  # "free" has nothing in flight any more; "held" does (offset 0)
    ctx.take("a")
    ctx.join("b", permits=100)
    ctx.produce(0, 4, keys=[held, free, held, free])  # offsets 2..5
    assert ctx.offsets("b") == [3, 5], "the free key flows to its new owner at once"
    assert ctx.offsets("a") == [], "the old owner gets nothing of the moved range"
    ctx.ack("a", [(0, 0)])  # the held key's last in-flight message is acknowledged
    assert ctx.offsets("b") == [3, 5, 2, 4], "now the held key follows, in order"


def test_per_key_order_is_kept_while_consumers_join_and_leave() -> None:
    rng = random.Random(42)
    ctx = Ctx(T.KEY_SHARED, partitions=(0, 1))
    keys = [f"k{i}".encode() for i in range(24)]
    key_of: dict[tuple[int, int], bytes] = {}
    holder: dict[bytes, str] = {}  # key -> consumer currently holding unacked messages of it
    held: dict[str, set[tuple[int, int]]] = defaultdict(set)
    acked: set[tuple[int, int]] = set()
    delivered_ever: set[tuple[int, int]] = set()
    names = iter(f"c{i}" for i in range(1000))
    live: list[str] = []

    def check_and_record() -> None:
        for cid in list(ctx.received):
            for p, o, _ in ctx.take(cid):
                k = key_of[(p, o)]
                other = holder.get(k)
                assert other in (None, cid), f"{k!r} sent to {cid} while {other} holds unacked messages of it"
                earlier = [x for x in key_of if x[0] == p and x[1] < o and key_of[x] == k]
                for e in earlier:
                    assert e in acked or e in held[cid], f"{(p, o)} of {k!r} overtook {e}"
                holder[k] = cid
                held[cid].add((p, o))
                delivered_ever.add((p, o))

    def release(cid: str, ids: set[tuple[int, int]]) -> None:
        held[cid] -= ids
        for k in {key_of[i] for i in ids}:
            if holder.get(k) == cid and not any(key_of[i] == k for i in held[cid]):
                del holder[k]

    for _step in range(400):
        op = rng.random()
        if not live:
            op = 0.4  # join
        if op < 0.3:
            p = rng.choice((0, 1))
            ks = [rng.choice(keys) for _ in range(rng.randint(1, 8))]
            start = ctx.next_offset[p]
            for i, k in enumerate(ks):
                key_of[(p, start + i)] = k
            ctx.produce(p, len(ks), keys=ks)
        elif op < 0.45 and len(live) < 5:
            cid = next(names)
            live.append(cid)
            ctx.join(cid, permits=rng.randint(1, 10))
        elif op < 0.55 and len(live) > 1:
            cid = live.pop(rng.randrange(len(live)))
            ctx.leave(cid)
            release(cid, set(held[cid]))
        elif op < 0.85:
            cid = rng.choice(live)
            mine = sorted(held[cid])
            some = set(rng.sample(mine, rng.randint(0, len(mine))))
            assert ctx.ack(cid, sorted(some)) == []
            acked.update(some)
            release(cid, some)
        else:
            ctx.flow(rng.choice(live), rng.randint(1, 10))
        check_and_record()
    # Drain: everything produced is eventually delivered and acknowledged.
    for _ in range(200):
        for cid in live:
            ctx.flow(cid, 50)
            check_and_record()
            drained = set(held[cid])
            assert ctx.ack(cid, sorted(drained)) == []
            acked.update(drained)
            release(cid, drained)
            check_and_record()
        if acked == set(key_of):
            break
    assert acked == set(key_of) == delivered_ever
