"""The dispatcher's memory budget, in bytes: what its subscriptions hold, per subscription and in total.

A subscription holds messages it read and has not let go of: read ahead and not sent (``pending``),
sent and not acknowledged (``inflight``), returned for redelivery, delayed by a nack, or waiting for
the DLQ. Before this budget only ``read_ahead_bytes`` bounded the first of these; the rest were bounded
by message counts (``max_unacked`` per consumer), so a Shared consumer that never acknowledged held
a whole backlog (1 GiB in issue 16, 1.11 GB of RSS).

Each subscription has a :class:`SubscriptionMemory` account its partition states charge as they take
records from the feed and credit as messages leave for good (acknowledged, dead-lettered, partition
detached, subscription closed). A message costs its share of its log batch (``Message.size``, batch
bytes over records plus the read-ahead estimate of 48) plus :data:`HELD_OVERHEAD`, what Python spends
around it while it is held (the ``Message`` object, its ints and its entries in the in-flight dicts;
measured by ``tests/unit/dispatcher/test_budget.py``). Payloads stay in the fetched batches, shared by
every subscription of the partition: nothing is copied per record.

When an account may not read more (:meth:`SubscriptionMemory.may_read`), its subscription stops
*wanting* records: the partition feeds stop reading for it (a follower pauses once nobody wants, and
an answer is not offered to a subscription over its budget), so the broker keeps the backlog instead
of this process. Nothing is dropped: what the subscription holds stays until acknowledged or returned.
As memory comes back the account calls ``on_resume`` (the runtime kicks its feeds).

The sharing rule (Pulsar's ``maxUnackedMessagesPerBroker`` with its blocked-subscription share, in bytes):

- a subscription never holds more than ``subscription_limit`` (default: a quarter of the total), so
  one careless consumer cannot take the whole budget;
- once the total reaches ``limit``, only subscriptions holding less than their fair share
  (``limit / subscriptions holding memory``) go on reading, up to that share: the ones that hold
  the memory stop, the others keep flowing. The total can then exceed ``limit`` by at most what the
  small subscriptions take up to their shares (never more than ``limit`` again: the worst case is 2x,
  the usual case a fetch or two), which is the price of never starving a well-behaved subscription.

Pure: no I/O, no clock; the runtime turns ``on_resume`` into a scheduled feed kick.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["HELD_OVERHEAD", "MemoryBudget", "SubscriptionMemory"]

#: Bytes Python spends per held message beyond ``Message.size``: the ``Message`` (8 slots, GC
#: header: ~96 bytes), its index int, and its entries in the subscription's and the consumer's
#: in-flight dicts (a key, a value pointer and a hash each, at the dicts' load factor). Measured
#: with tracemalloc in the unit test (about 230 bytes); rounded up.
HELD_OVERHEAD = 256


class MemoryBudget:
    """The whole dispatcher's budget. Caller: ``DispatcherService`` (one), the accounts."""

    __slots__ = ("accounts", "limit", "paused", "paused_total", "subscription_limit", "used")

    def __init__(self, limit: int, subscription_limit: int = 0) -> None:
        #: Total bytes all subscriptions may hold; 0: no budget (nothing ever pauses).
        self.limit = limit
        #: Bytes one subscription may hold; 0: a quarter of ``limit``.
        self.subscription_limit = subscription_limit or limit // 4
        self.used = 0
        #: Accounts holding memory (used > 0) or paused: the fair share divides among these.
        self.accounts: set[SubscriptionMemory] = set()
        #: Accounts that stopped reading and wait for memory.
        self.paused: set[SubscriptionMemory] = set()
        #: Times an account stopped reading (the ``reads_paused`` counter reads this).
        self.paused_total = 0

    def account(self, on_resume: Callable[[], None] | None = None) -> SubscriptionMemory:
        return SubscriptionMemory(self, on_resume)

    def fair_share(self) -> int:
        return self.limit // max(1, len(self.accounts))

    def _freed(self) -> None:
        """Memory came back: paused accounts may read again (the total went below the limit, or the
        fair share grew). Usually no account is paused: then this is one test."""
        if self.paused:
            for acc in list(self.paused):
                acc.check_resume()


class SubscriptionMemory:
    """One subscription's account. Caller: its ``PartitionState``s (charge/credit), ``Subscription``."""

    __slots__ = ("budget", "on_resume", "paused", "pauses", "used")

    def __init__(self, budget: MemoryBudget, on_resume: Callable[[], None] | None = None) -> None:
        self.budget = budget
        self.on_resume = on_resume
        self.used = 0
        self.paused = False
        #: Times this account stopped reading.
        self.pauses = 0

    def charge(self, n: int) -> None:
        if n:
            self.used += n
            b = self.budget
            b.used += n
            b.accounts.add(self)

    def credit(self, n: int) -> None:
        if not n:
            return
        b = self.budget
        self.used -= n
        b.used -= n
        if self.used <= 0:
            self.used = 0
            if not self.paused:
                b.accounts.discard(self)
        b._freed()

    def release_all(self) -> None:
        """The subscription is gone (closed, unloaded): everything it held is credited."""
        self.paused = False
        b = self.budget
        b.paused.discard(self)
        self.credit(self.used)
        b.accounts.discard(self)

    def _allowed(self) -> bool:
        b = self.budget
        if not b.limit:
            return True
        used = self.used
        if used >= b.subscription_limit:
            return False
        return b.used < b.limit or used < b.fair_share()

    def may_read(self) -> bool:
        """Whether the subscription may take more records now; records a pause when not."""
        if self._allowed():
            return True
        if not self.paused:
            self.paused = True
            self.pauses += 1
            b = self.budget
            b.paused_total += 1
            b.accounts.add(self)
            b.paused.add(self)
        return False

    def check_resume(self) -> None:
        """Memory came back: a paused account that may read again says so (once)."""
        if self.paused and self._allowed():
            self.paused = False
            b = self.budget
            b.paused.discard(self)
            if self.used <= 0:
                b.accounts.discard(self)
            if self.on_resume is not None:
                self.on_resume()
