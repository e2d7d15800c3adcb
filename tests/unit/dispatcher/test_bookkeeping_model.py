"""The subscription's bookkeeping against a per-message model, under random traffic (issue 19).

The push path reads, hands out and acknowledges whole runs of records at C level where it can
(``PartitionState._take_run``: an answer with no filter and nothing acknowledged inside it;
``PartitionState.ack``: a group of acks that is one run becomes one cursor range;
``messages.encode_batches_event``: a delivery of one increasing index run per log batch is one cut).
Here random answers (with holes: compacted or aborted records), cursors that start with acknowledged
ranges (a restart), Flow, acks (with ids of other consumers and unknown ones), nacks, nack delays,
ack timeouts and consumers leaving run against a model that keeps one state per offset; after every
step the state machine must agree with it on every offset: acknowledged or not, held by whom, how
often it came back, and the bytes and counts it holds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.codec.batch import BatchBuilder, batch_views, stamp
from sluice.dispatcher.budget import HELD_OVERHEAD
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.messages import Message, messages_of
from sluice.dispatcher.model import SubscriptionType
from tests.examples import examples
from tests.unit.dispatcher.context import Ctx

NACK_DELAY = 10
ACK_TIMEOUT = 50
CONSUMERS = ("a", "b")

op = st.one_of(
    st.tuples(
        st.just("read"), st.integers(1, 40), st.sets(st.integers(0, 39), max_size=8), st.integers(0, 3)
    ),
    st.tuples(st.just("flow"), st.sampled_from(CONSUMERS), st.integers(1, 60)),
    # Mostly clean acks (every id in flight at the consumer: the C-level path), some with bad ids.
    st.tuples(
        st.just("ack"),
        st.sampled_from(CONSUMERS),
        st.sampled_from([1.0, 1.0, 0.5, 0.2]),
        st.sampled_from([0, 0, 1, 3]),
    ),
    st.tuples(st.just("nack"), st.sampled_from(CONSUMERS), st.floats(0, 1)),
    st.tuples(st.just("advance"), st.integers(1, 60)),
    st.tuples(st.just("rejoin"), st.sampled_from(CONSUMERS)),
)


class Model:
    """One state per offset: ``acked``, ``held[c]`` (in flight at consumer c), or waiting (read and
    not in flight: pending, returned, delayed); plus how often each offset came back."""

    def __init__(self, acked: set[int]) -> None:
        self.acked = set(acked)
        self.held: dict[str, set[int]] = defaultdict(set)
        self.returned: dict[int, int] = defaultdict(int)
        self.read: set[int] = set()

    def owner(self, o: int) -> str | None:
        return next((c for c, s in self.held.items() if o in s), None)


def _answer(ctx: Ctx, n: int, holes: set[int], tail_gap: int) -> tuple[list[Message], int, set[int]]:
    """``n`` records from the partition's next offset, minus ``holes`` (gone from the log), and the
    answer's end ``tail_gap`` past its last record."""
    start = ctx.next_offset[0]
    b = BatchBuilder()
    for i in range(n):
        b.append(b"v%d" % (start + i), b"k%d" % (i % 5), None, None, 1_000 + i)
    raw = bytearray(b.build())
    stamp(raw, 0, start, 1, 0)
    gone = {start + h for h in holes if h < n}
    msgs = [m for m in messages_of(batch_views(bytes(raw)), 0, start) if m.offset not in gone]
    end = start + n + tail_gap
    ctx.next_offset[0] = end
    return msgs, end, gone | set(range(start + n, end))


@settings(max_examples=examples(150), deadline=None)
@given(
    st.lists(op, min_size=5, max_size=40),
    st.lists(st.tuples(st.integers(0, 60), st.integers(1, 8)), max_size=4),
    st.booleans(),
)
def test_bookkeeping_matches_a_per_message_model(
    ops: list[tuple[Any, ...]], restart_acks: list[tuple[int, int]], timeouts: bool
) -> None:
    # A restarted cursor: mark_delete 0 with some acknowledged ranges above it (holes a restart leaves).
    cursor = PartitionCursor(0)
    pre: set[int] = set()
    for s, n in restart_acks:
        cursor.ack_range(s + 1, s + 1 + n)
        pre.update(range(s + 1, s + 1 + n))
    ctx = Ctx(SubscriptionType.SHARED, cursors={0: cursor})
    model = Model(pre)
    spec = {"nack_delay_ms": NACK_DELAY, "ack_timeout_ms": ACK_TIMEOUT if timeouts else 0}
    for c in CONSUMERS:
        ctx.join(c, **spec)
    seen = 0  # deliveries checked so far, per ctx.received
    checked: dict[str, int] = defaultdict(int)

    def settle() -> None:
        """Fold the deliveries since the last look into the model, checking each."""
        nonlocal seen
        for c in CONSUMERS:
            got = ctx.received[c][checked[c] :]
            checked[c] = len(ctx.received[c])
            for p, o, count in got:
                assert p == 0
                assert o not in model.acked, f"acknowledged offset {o} delivered"
                assert model.owner(o) is None, f"offset {o} delivered while in flight at {model.owner(o)}"
                assert count == model.returned[o], (o, count, model.returned[o])
                model.held[c].add(o)

    def returned_from(c: str, offsets: set[int]) -> None:
        for o in offsets:
            model.returned[o] += 1
        model.held[c] -= offsets

    for item in ops:
        kind = item[0]
        if kind == "read":
            _, n, holes, tail = item
            msgs, end, gone = _answer(ctx, n, holes, tail)
            model.acked |= gone
            model.read |= {m.offset for m in msgs}
            ctx.apply(ctx.sub.offer(0, msgs, end, ctx.now))
        elif kind == "flow":
            _, c, k = item
            ctx.flow(c, k)
        elif kind == "ack":
            _, c, share, bogus = item
            mine = sorted(model.held[c])
            chosen = set(mine[: int(len(mine) * share)])
            other = next(x for x in CONSUMERS if x != c)
            foreign = set(sorted(model.held[other])[:bogus])
            unknown = {ctx.next_offset[0] + 1000 + i for i in range(bogus)}
            bad = ctx.ack(c, [(0, o) for o in chosen | foreign | unknown])
            assert sorted(bad) == sorted((0, o) for o in foreign | unknown)
            model.held[c] -= chosen
            model.acked |= chosen
        elif kind == "nack":
            _, c, share = item
            mine = sorted(model.held[c])
            chosen = set(mine[: int(len(mine) * share)])
            assert not ctx.nack(c, [(0, o) for o in chosen])
            returned_from(c, chosen)
        elif kind == "advance":
            _, ms = item
            before = {c: set(model.held[c]) for c in CONSUMERS}
            ctx.advance(ms)
            if timeouts:
                # What timed out left its consumer (and may have gone out again at once, to either).
                again = {o for x in CONSUMERS for _, o, _ in ctx.received[x][checked[x] :]}
                for c in CONSUMERS:
                    still = set(ctx.consumers[c].inflight.get(0, {}))
                    returned_from(c, (before[c] - still) | (before[c] & again))
        else:
            _, c = item
            returned_from(c, set(model.held[c]))
            ctx.leave(c)
            ctx.join(c, **spec)
            checked[c] = len(ctx.received[c])
        settle()
        _check(ctx, model)


def _check(ctx: Ctx, model: Model) -> None:
    ps = ctx.sub.partitions[0]
    cur = ps.cursor
    top = ctx.next_offset[0]
    for o in range(top + 2):
        assert cur.is_acked(o) == (o in model.acked), f"offset {o}: cursor {cur.is_acked(o)}"
    for c in CONSUMERS:
        consumer = ctx.consumers[c]
        assert set(consumer.inflight.get(0, {})) == model.held[c], c
        assert consumer.unacked == len(model.held[c]), c
    assert set(ps.inflight) == set().union(*model.held.values())
    # Everything read and not acknowledged is held somewhere, once, and counted in bytes once.
    waiting = [m.offset for m in ps.pending] + list(ps.replay) + list(ps.delayed) + list(ps.dead)
    assert len(waiting) == len(set(waiting))
    held = set(waiting) | set(ps.inflight)
    assert held == model.read - model.acked
    msgs: list[Message] = list(ps.pending) + list(ps.replay.values()) + list(ps.delayed.values())
    for c in CONSUMERS:
        msgs += ctx.consumers[c].inflight.get(0, {}).values()
    assert ps.held_bytes == sum(m.size + HELD_OVERHEAD for m in msgs)
    assert ps.pending_bytes == sum(m.size for m in ps.pending)
    assert ps.read_position == top
