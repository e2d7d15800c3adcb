"""The dispatcher's memory budget (``budget.py``): what subscriptions hold is counted in bytes, comes back
when messages leave for good, and pauses reading per subscription and in total without starving the
well-behaved subscriptions."""

from __future__ import annotations

import gc
import tracemalloc

from sluice.codec.batch import BatchBuilder, batch_views, stamp
from sluice.dispatcher.budget import HELD_OVERHEAD, MemoryBudget, SubscriptionMemory
from sluice.dispatcher.consumer import Consumer, ConsumerSpec
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.messages import Message, messages_of
from sluice.dispatcher.model import SubscriptionSettings
from sluice.dispatcher.model import SubscriptionType as T
from sluice.dispatcher.subscription import Subscription

from .context import Ctx


def _records(start: int, n: int, size: int = 100) -> list[Message]:
    builder = BatchBuilder()
    for i in range(n):
        builder.append(b"x" * size, None, None, None, 1000 + i)
    raw = bytearray(builder.build())
    stamp(raw, 0, start, 1, 0)
    return messages_of(batch_views(bytes(raw)), 0, start)


class _Sub:
    """One Shared subscription of one partition with its own budget account."""

    def __init__(self, account: SubscriptionMemory, **settings: object) -> None:
        self.sub = Subscription("t", "s", SubscriptionSettings(type=T.SHARED, **settings), account)  # type: ignore[arg-type]
        self.sub.attach_partition(PartitionCursor(0), 0)
        self.sub.activate(0)
        self.next = 0
        self.consumer: Consumer | None = None

    def join(self, permits: int, **spec: object) -> Consumer:
        c, _ = self.sub.add_consumer(ConsumerSpec("c", "c", **spec), self.sub.settings, 0)  # type: ignore[arg-type]
        self.sub.flow(c, permits, 0)
        self.consumer = c
        return c

    def produce(self, n: int, size: int = 100) -> None:
        msgs = _records(self.next, n, size)
        self.next += n
        self.sub.offer(0, msgs, self.next, 0)

    def ack_all(self) -> None:
        c = self.consumer
        assert c is not None
        self.sub.ack(c, {p: list(m) for p, m in c.inflight.items()}, False, 0)


def test_every_way_out_gives_the_bytes_back() -> None:
    budget = MemoryBudget(1 << 30)
    s = _Sub(budget.account())
    s.produce(100)
    held = s.sub.memory.used
    assert held >= 100 * (100 + HELD_OVERHEAD)
    assert budget.used == held
    c = s.join(60)  # 60 in flight, 40 pending: moving between states costs nothing
    assert s.sub.memory.used == held
    s.sub.nack(c, {0: list(c.inflight[0])[:10]}, 0)  # delayed, still held
    assert s.sub.memory.used == held
    s.ack_all()
    assert 0 < s.sub.memory.used < held
    s.sub.flow(c, 1000, 0)
    s.sub.tick(10_000)  # the nack delay ends: redelivered
    s.ack_all()
    assert s.sub.memory.used == 0
    assert budget.used == 0
    # A consumer leaving returns its messages: still held, for the next consumer.
    s.produce(10)
    s.sub.remove_consumer(c, 0)
    assert s.sub.memory.used > 0
    # Closing the subscription (unload) gives everything back.
    s.sub.close()
    assert budget.used == 0
    assert not budget.accounts


def test_dead_letters_and_detached_partitions_give_their_bytes_back() -> None:
    ctx = Ctx(T.SHARED, partitions=(0, 1))
    ctx.join("a", permits=100, max_redeliver=1)
    ctx.produce(0, 5)
    ctx.produce(1, 5)
    mem = ctx.sub.memory
    assert mem.used > 0
    ctx.nack("a", [(0, o) for o in range(5)])
    ctx.advance(60_000)
    ctx.nack("a", [(0, o) for o in range(5)])  # past max_redeliver: dead-lettered (and confirmed)
    ctx.advance(60_000)
    assert len(ctx.dead) == 5
    assert mem.used == ctx.sub.partitions[1].held_bytes > 0
    ctx.apply(ctx.sub.detach_partition(1, ctx.now))
    assert mem.used == 0


def test_a_subscription_stops_reading_at_its_own_limit_and_resumes_on_acks() -> None:
    resumed: list[int] = []
    budget = MemoryBudget(10 << 20, 100 * (100 + 48 + HELD_OVERHEAD))
    s = _Sub(budget.account(lambda: resumed.append(1)))
    s.join(10_000)
    assert s.sub.memory.may_read()
    s.produce(100)  # never acknowledged
    assert not s.sub.memory.may_read()
    assert budget.paused_total == 1
    assert s.sub.memory in budget.paused
    assert not s.sub.memory.may_read()  # still paused: counted once
    assert budget.paused_total == 1
    s.ack_all()
    assert resumed == [1]
    assert s.sub.memory.may_read()
    assert not budget.paused


def test_at_the_total_limit_only_subscriptions_over_their_fair_share_stop() -> None:
    per_message = 100 + 48 + HELD_OVERHEAD
    budget = MemoryBudget(1000 * per_message, 900 * per_message)
    hostile, polite = _Sub(budget.account()), _Sub(budget.account())
    hostile.join(100_000)
    polite.join(100_000)
    polite.produce(10)
    hostile.produce(1000)  # never acknowledged: the total is reached
    assert budget.used >= budget.limit
    assert not hostile.sub.memory.may_read()
    # The polite one holds far less than half the budget: it goes on reading.
    assert polite.sub.memory.may_read()
    polite.ack_all()
    for _ in range(20):
        polite.produce(10)
        assert polite.sub.memory.may_read()
        polite.ack_all()
    # ...up to its fair share, even while it holds messages.
    polite.produce(600)
    assert not polite.sub.memory.may_read()
    polite.ack_all()
    assert polite.sub.memory.may_read()


def test_no_limit_never_pauses() -> None:
    budget = MemoryBudget(0)
    s = _Sub(budget.account())
    s.join(1 << 20)
    s.produce(5000)
    assert s.sub.memory.may_read()
    assert budget.used > 0


def test_the_count_covers_what_python_holds_for_messages_in_flight() -> None:
    """HELD_OVERHEAD against tracemalloc: 20,000 small records read and sent, never acknowledged."""
    n = 20_000
    budget = MemoryBudget(0)
    s = _Sub(budget.account())
    c = s.join(n)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        msgs = _records(0, n, 50)
        s.sub.offer(0, msgs, n, 0)
        del msgs
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert sum(len(m) for m in c.inflight.values()) == n
    counted = s.sub.memory.used
    # Counted within -10% / +60% of what Python really allocated for them (batch bytes included).
    assert held * 0.9 <= counted <= held * 1.6, (held / n, counted / n)
