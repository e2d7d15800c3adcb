"""Memory a subscription gives back: in-flight dicts a burst left empty (``docs/dispatcher.md``,
"What a consumer costs")."""

from __future__ import annotations

import gc
import sys
import tracemalloc

import pytest

from sluice.dispatcher.model import SubscriptionType as T
from sluice.dispatcher.partition_state import NO_PENDING

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


def _served_subscription() -> Ctx:
    """A Shared subscription on 4 partitions whose consumer took and acknowledged 4,000 messages
    (bursts of 250 per partition), then left idle: what the runtime's compactor then gives back."""
    ctx = Ctx(T.SHARED, partitions=(0, 1, 2, 3))
    ctx.join("a", permits=1000)
    for _ in range(4):
        for p in range(4):
            ctx.produce(p, 250)
        assert len(ctx.take("a")) == 1000
        ctx.ack_all("a")
        ctx.flow("a", 1000)
    ctx.sub.give_back_memory()
    return ctx


def test_an_idle_subscription_keeps_under_8_kb_after_serving_traffic() -> None:
    """Issue 20: a subscription of its own must not cost the dispatcher 100-200 KB. The state
    machine's share, measured in-process: it was 21 KB after such a burst (an emptied pending
    deque kept its spare blocks, 8 KB; every partition had its own empty deque and set), 12 KB
    fresh (all its allocations); what its own modules allocate is ~5.9 KB now
    (docs/dispatcher.md, "What a subscription costs")."""
    ctx = _served_subscription()  # warm up imports and caches outside the measurement
    assert all(ps.pending is NO_PENDING for ps in ctx.sub.partitions.values())
    count = 20
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        kept = [_served_subscription().sub for _ in range(count)]
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # Only what the subscriptions' own modules allocated (not the test's fake log and records).
    ours = tracemalloc.Filter(True, "*/sluice/dispatcher/*")
    diff = after.filter_traces([ours]).compare_to(before.filter_traces([ours]), "filename")
    grown = sum(s.size_diff for s in diff)
    per_subscription = grown / count
    assert len(kept) == count
    assert per_subscription < 8 * 1024, f"{per_subscription:.0f} bytes per idle subscription"


def test_the_shared_empty_pending_queue_refuses_additions_and_is_replaced_on_read() -> None:
    with pytest.raises(AssertionError):
        NO_PENDING.append(None)  # type: ignore[arg-type]
    assert not NO_PENDING
    ctx = _served_subscription()
    ps = ctx.sub.partitions[0]
    assert ps.pending is NO_PENDING
    ctx.produce(0, 5)  # no permits left to the consumer? it was given 1,000 after the last ack
    assert sorted(o for p, o, _ in ctx.take("a") if p == 0) == [1000, 1001, 1002, 1003, 1004]
    ctx.leave("a")
    ctx.produce(1, 3)  # nobody to send to: read ahead into a deque of its own
    assert ctx.sub.partitions[1].pending is not NO_PENDING
    assert [m.offset for m in ctx.sub.partitions[1].pending] == [1000, 1001, 1002]
    assert not NO_PENDING
