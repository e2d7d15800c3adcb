"""One partition of a subscription: what was read, sent, returned, delayed and dead-lettered.

Pure, like the state machine it belongs to (``subscription.py``): ``pending`` (read, never sent),
``replay`` (sent, came back, to be sent again first, in offset order), ``inflight`` (sent and
unacknowledged: offset -> consumer), ``delayed`` (nacked, waiting for the nack delay) and ``dead``
(handed to the DLQ producer, waiting for its confirmation). Its own seam: the selectors
(``selectors.py``) take messages from it and the subscription settles acknowledgements on it, and
neither needs the other to do so.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from operator import attrgetter

from sluice.codec.sql_filter import SqlFilter
from sluice.dispatcher.budget import HELD_OVERHEAD, MemoryBudget, SubscriptionMemory
from sluice.dispatcher.consumer import Consumer
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.keyindex import KeyedReadAhead
from sluice.dispatcher.messages import Message, offset_of

__all__ = ["PartitionState", "unbudgeted"]


def unbudgeted() -> SubscriptionMemory:
    """An account of a budget without limit (tests, tools): charges are counted, nothing pauses."""
    return MemoryBudget(0).account()


class _NoPending(deque[Message]):
    """The ``pending`` of a partition with nothing read ahead: one shared, empty, read-only deque.

    A deque is ~760 bytes even empty (its first block), and one that carried traffic keeps up to
    16 spare blocks of 528 bytes: 8 KB per partition after a burst, per subscription. An idle
    partition points here instead (``take_read`` gives it a deque of its own when records arrive,
    ``give_back`` returns an emptied one). Adding to it is a bug, not a silent drop: it raises."""

    __slots__ = ()

    def _refuse(self, *args: object) -> None:
        raise AssertionError("the shared empty pending queue is read-only")

    append = appendleft = extend = extendleft = insert = _refuse


NO_PENDING: deque[Message] = _NoPending()


class PartitionState:
    """One partition of a subscription. Caller: ``Subscription`` and ``selectors``."""

    __slots__ = (
        "account",
        "active",
        "awaiting_save",
        "cursor",
        "dead",
        "delayed",
        "delivery_seq",
        "held_bytes",
        "inflight",
        "keyed",
        "partition",
        "pending",
        "pending_bytes",
        "read_position",
        "replay",
        "replay_heap",
    )

    def __init__(
        self, cursor: PartitionCursor, read_position: int, account: SubscriptionMemory | None = None
    ) -> None:
        self.partition = cursor.partition
        #: The subscription's memory account (``budget.py``), charged with ``held_bytes``.
        self.account = account if account is not None else unbudgeted()
        #: Budget bytes of every message this partition holds, in any state (``budget.py``).
        self.held_bytes = 0
        self.cursor = cursor
        self.read_position = read_position
        #: ``NO_PENDING`` while nothing is read ahead (see ``_NoPending``).
        self.pending: deque[Message] = NO_PENDING
        self.pending_bytes = 0
        #: Key_Shared: the read-ahead's filed prefix, by owning consumer (``keyindex.py``); made by the
        #: first Key_Shared pass, None otherwise. ``pending_bytes`` counts both.
        self.keyed: KeyedReadAhead | None = None
        self.replay: dict[int, Message] = {}
        # Offsets of ``replay`` as a heap; entries no longer in ``replay`` are skipped lazily.
        self.replay_heap: list[int] = []
        self.inflight: dict[int, Consumer] = {}
        self.delivery_seq: dict[int, int] = {}
        self.delayed: dict[int, Message] = {}
        self.dead: dict[int, Message] = {}
        #: Offsets in ``delayed`` that wait only for their raised count to be persisted (a set made
        #: on first use: 216 bytes per partition that most subscriptions never need).
        self.awaiting_save: set[int] | None = None
        #: Exclusive/Failover: the consumer receiving this partition.
        self.active: Consumer | None = None

    def has_work(self) -> bool:
        """Something may be sent now (new messages only below the cursor's gate)."""
        return (
            bool(self.replay)
            or bool(self.keyed)
            or bool(self.pending and self.pending[0].offset < self.cursor.gate)
        )

    def unfile(self) -> None:
        """Key_Shared: put the filed read-ahead back in front of ``pending`` (the owners changed, or the
        gate may go down); the next pass files it again."""
        keyed = self.keyed
        if keyed:
            back = keyed.unfile()
            if self.pending is NO_PENDING:
                self.pending = deque()
            self.pending.extendleft(reversed(back))

    def holds_pending(self, o: int) -> bool:
        """Whether offset ``o`` waits in the read-ahead (never sent)."""
        pending = self.pending
        if pending and pending[0].offset <= o <= pending[-1].offset:
            at = bisect_left(pending, o, key=offset_of)
            if at < len(pending) and pending[at].offset == o:
                return True
        keyed = self.keyed
        return keyed is not None and keyed.holds(o)

    def add_replay(self, m: Message) -> None:
        if not self.cursor.count_saved(m.offset):
            # Its raised count is not persisted yet: wait for the flush (asked for now).
            self.delayed[m.offset] = m
            if self.awaiting_save is None:
                self.awaiting_save = set()
            self.awaiting_save.add(m.offset)
            self.cursor.urgent = True
            return
        self.replay[m.offset] = m
        heapq.heappush(self.replay_heap, m.offset)

    def release_saved(self) -> None:
        """After a cursor save: messages whose counts are now persisted may be sent again."""
        waiting = self.awaiting_save
        if not waiting:
            self.awaiting_save = None
            return
        cursor = self.cursor
        for o in [o for o in waiting if cursor.count_saved(o)]:
            waiting.discard(o)
            m = self.delayed.pop(o, None)
            if m is not None:
                self.add_replay(m)

    def take_ordered(self, n: int) -> list[Message]:
        """Up to ``n`` messages: redeliveries first (lowest offset first), then new ones."""
        out: list[Message] = []
        replay = self.replay
        if replay:
            heap = self.replay_heap
            while heap and len(out) < n:
                m = replay.pop(heapq.heappop(heap), None)
                if m is not None:
                    out.append(m)
            if not replay:
                heap.clear()
        k = min(n - len(out), len(self.pending))
        if k > 0:
            pending = self.pending
            gate = self.cursor.gate
            if pending[k - 1].offset >= gate:
                # Some of the k are beyond the persisted delivered-up-to mark: only those below go.
                # pending is in offset order, so a binary search finds them (not a step per message).
                below = _first_at_or_above(pending, k - 1, gate)
                self.cursor.stall(pending[below].offset)
                k = below
            if k == len(pending):
                taken = list(pending)
                pending.clear()
            else:
                popleft = pending.popleft
                taken = [popleft() for _ in range(k)]
            self.pending_bytes -= sum(map(_size_of, taken))
            out += taken
        return out

    def unacked_messages(self) -> int:
        """Read and not acknowledged, in any state."""
        filed = len(self.keyed) if self.keyed is not None else 0
        held = len(self.replay) + len(self.inflight) + len(self.delayed) + len(self.dead)
        return len(self.pending) + filed + held

    # ---- reading (caller: ``Subscription.offer``) ---------------------------------------------------

    def take_read(
        self,
        messages: list[Message],
        next_offset: int,
        tags: frozenset[str] | None,
        sql: SqlFilter | None = None,
    ) -> None:
        """Records read from the log, in offset order, covering ``[first fetched, next_offset)``, with
        ``next_offset`` past the read position. Offsets below the read position are skipped (another
        subscription asked for them); acked ones (a restarted cursor with holes) are skipped;
        filtered-out records (a tag not in ``tags``, or headers ``sql`` does not match) and offsets
        missing from the log count as acknowledged."""
        pos = self.read_position
        cursor = self.cursor
        acked = cursor.acked
        md = cursor.mark_delete
        if tags is None and sql is None and messages and self._take_run(messages, next_offset):
            return
        skip: list[tuple[int, int]] = []  # runs to acknowledge (gaps, filtered)
        expected = pos
        added = 0
        if self.pending is NO_PENDING:
            self.pending = deque()
        before = len(self.pending)
        append = self.pending.append
        for m in messages:
            o = m.offset
            if o < pos:
                continue
            if o > expected:
                skip.append((expected, o))
            expected = o + 1
            if o < md or (acked and o in acked):
                continue
            if (tags is not None and m.tag not in tags) or (
                sql is not None and not sql.matches(m.view.headers(m.index))
            ):
                if skip and skip[-1][1] == o:
                    skip[-1] = (skip[-1][0], o + 1)
                else:
                    skip.append((o, o + 1))
                continue
            append(m)
            added += m.size
        if next_offset > expected:
            skip.append((expected, next_offset))
        self.pending_bytes += added
        if added:
            self.charge(added + (len(self.pending) - before) * HELD_OVERHEAD)
        self.read_position = next_offset
        for s, e in skip:
            cursor.ack_range(s, e)

    def _take_run(self, messages: list[Message], next_offset: int) -> bool:
        """``take_read`` without a step per record, for the usual answer: no filter, and the records
        from the read position on are one gapless run that the cursor holds nothing of (not below
        its mark-delete, no acknowledged range reaching into it). False: not that case, nothing done
        (the general loop decides record by record)."""
        pos = self.read_position
        k = 0 if messages[0].offset >= pos else bisect_left(messages, pos, key=offset_of)
        n = len(messages) - k
        if n <= 0:
            return False
        first = messages[k].offset
        last = messages[-1].offset
        cursor = self.cursor
        if last - first + 1 != n or first < cursor.mark_delete:
            return False  # a gap inside (compacted or aborted records), or acknowledged ones
        acked = cursor.acked
        if acked and acked.last_end > first and not _clear_of(acked.flat, first, last + 1):
            return False  # acknowledged records among them (a restarted cursor with holes)
        if self.pending is NO_PENDING:
            self.pending = deque()
        taken = messages[k:] if k else messages
        self.pending.extend(taken)
        added = sum(map(_size_of, taken))
        self.pending_bytes += added
        self.charge(added + n * HELD_OVERHEAD)
        self.read_position = next_offset
        if first > pos:
            cursor.ack_range(pos, first)  # missing from the log: counts as acknowledged
        if next_offset > last + 1:
            cursor.ack_range(last + 1, next_offset)
        return True

    # ---- memory (``budget.py``) ------------------------------------------------------------------------

    def charge(self, n: int) -> None:
        self.held_bytes += n
        self.account.charge(n)

    def credit_messages(self, msgs: Iterable[Message]) -> None:
        """These messages left for good (acknowledged, dead-lettered): give their bytes back."""
        gone = msgs if isinstance(msgs, list) else list(msgs)
        if gone:
            n = sum(map(_size_of, gone)) + len(gone) * HELD_OVERHEAD
            self.held_bytes -= n
            self.account.credit(n)

    def dead_lettered(self, offsets: Iterable[int]) -> None:
        """The DLQ producer stored these messages: acknowledge them."""
        gone = [m for o in offsets if (m := self.dead.pop(o, None)) is not None]
        self.credit_messages(gone)
        self.cursor.ack_sorted(sorted(m.offset for m in gone))

    def release_all(self) -> None:
        """The partition is no longer served: its messages are dropped (they stay in the log) and
        their bytes go back to the budget."""
        self.pending = NO_PENDING
        self.pending_bytes = 0
        if self.keyed is not None:
            self.keyed.clear()
        self.replay.clear()
        self.replay_heap.clear()
        self.delayed.clear()
        self.dead.clear()
        n, self.held_bytes = self.held_bytes, 0
        self.account.credit(n)

    # ---- acknowledgements (caller: ``Subscription.ack``) --------------------------------------------

    def ackable(self, consumer: Consumer, o: int) -> bool:
        """Whether ``consumer`` may acknowledge offset ``o`` (a cumulative ack's own id)."""
        owner = self.inflight.get(o)
        if owner is not None:
            return owner is consumer
        return o in self.replay or o in self.delayed or (o < self.read_position and self.cursor.is_acked(o))

    def ack(
        self,
        consumer: Consumer,
        offsets: Iterable[int],
        bad: list[tuple[int, int]],
        release: Callable[[Consumer, Message], None] | None,
    ) -> int:
        """Acknowledge ``offsets`` for ``consumer``; unknown ones or another consumer's go to ``bad``.
        ``release`` (Key_Shared only) gives up the consumer's hold on a message's key hash. Returns
        how many messages the consumer no longer holds."""
        pinf = self.inflight
        cinf = consumer.inflight.get(self.partition)
        unique = set(offsets)
        if cinf is not None and release is None and cinf.keys() >= unique:
            # The common case (every id is in flight at this consumer): bulk C-level dict work
            # instead of a Python loop per id.
            deque(map(pinf.pop, unique), 0)
            self.credit_messages(list(map(cinf.pop, unique)))
            done = sorted(unique)
            if self.delivery_seq:
                deque(map(self.delivery_seq.pop, done, repeat(None)), 0)
            if done and done[-1] - done[0] + 1 == len(done):
                self.cursor.ack_range(done[0], done[-1] + 1)  # one run (the usual group of acks)
            else:
                self.cursor.ack_sorted(done)
            return len(done)
        done = []
        freed: list[Message] = []
        released = 0
        for o in unique:
            owner = pinf.get(o)
            if owner is consumer:
                del pinf[o]
                assert cinf is not None
                m = cinf.pop(o)
                if release is not None:
                    release(consumer, m)
                freed.append(m)
                done.append(o)
                released += 1
            elif owner is None:
                back = self.replay.pop(o, None) or self.delayed.pop(o, None)
                if back is not None:
                    freed.append(back)
                    done.append(o)
                elif not (o < self.read_position and self.cursor.is_acked(o)):
                    bad.append((self.partition, o))
            else:
                bad.append((self.partition, o))
        self.credit_messages(freed)
        if done:
            if self.delivery_seq:
                for o in done:
                    self.delivery_seq.pop(o, None)
            done.sort()
            self.cursor.ack_sorted(done)
        return released

    def give_back(self, consumers: Iterable[Consumer]) -> None:
        """Free the tables of this partition's empty in-flight dicts, and its emptied pending deque
        (with the spare blocks a deque keeps: ``_NoPending``). A dict keeps its table as its
        entries go: one that held a burst (9 KB at 250 messages) would keep it while empty, per
        partition and per consumer. Not done on each ack: a dict cleared whenever it empties is
        regrown from 8 slots by the next deliveries (``bench/push_throughput.py``: 2.18 µs of
        dispatcher CPU per message against 2.03, medians of 8 runs); the runtime calls this every
        few seconds instead (``docs/dispatcher.md``, "What a consumer costs")."""
        if not self.pending:
            self.pending = NO_PENDING
        if self.keyed is not None and not self.keyed:
            self.keyed.clear()  # its emptied queues (a deque per owner: ~760 bytes each)
        if not self.inflight:
            self.inflight.clear()
        if not self.delivery_seq:
            self.delivery_seq.clear()
        for c in consumers:
            cinf = c.inflight.get(self.partition)
            if cinf is not None and not cinf:
                cinf.clear()


_size_of = attrgetter("size")


def _clear_of(bounds: Sequence[int], start: int, end: int) -> bool:
    """Whether the sorted, disjoint ``[s, e)`` ranges ``bounds`` (flat) hold no offset of ``[start, end)``."""
    i = bisect_right(bounds, start)
    if i % 2:
        return False  # start is inside a range
    return i == len(bounds) or bounds[i] >= end


def _first_at_or_above(pending: deque[Message], hi: int, gate: int) -> int:
    """The index of the first of ``pending[0..hi]`` (in offset order) at or above ``gate``, knowing
    ``pending[hi]`` is."""
    lo = 0
    while lo < hi:
        mid = (lo + hi) // 2
        if pending[mid].offset < gate:
            lo = mid + 1
        else:
            hi = mid
    return lo
