"""Memory a subscription gives back: in-flight dicts a burst left empty (``docs/dispatcher.md``,
"What a consumer costs")."""

from __future__ import annotations

import sys

from sluice.dispatcher.model import SubscriptionType as T

from .context import Ctx


def test_empty_in_flight_dicts_give_their_tables_back_and_keep_working() -> None:
    ctx = Ctx(T.SHARED, partitions=(0, 1))
    consumer = ctx.join("a", permits=1000)
    for p in (0, 1):
        ctx.produce(p, 250)
    assert len(ctx.take("a")) == 500
    ctx.ack_all("a")
    states = ctx.sub.partitions.values()
    tables = [ps.inflight for ps in states] + list(consumer.inflight.values())
    assert all(not d for d in tables)
    # Empty, yet each still holds the table of 250 entries (a dict does not shrink as entries go).
    assert all(sys.getsizeof(d) > 4096 for d in tables)
    ctx.sub.give_back_memory()
    assert all(sys.getsizeof(d) < 256 for d in tables)
    # A partition with messages still in flight keeps them; the dispatch goes on as before.
    ctx.produce(0, 3)
    ctx.sub.give_back_memory()
    assert sorted(o for p, o, _ in ctx.take("a") if p == 0) == [250, 251, 252]
    assert len(ctx.sub.partitions[0].inflight) == 3
    ctx.ack_all("a")
    assert ctx.sub.unacked_total() == 0
