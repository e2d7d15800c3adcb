"""Who gets which message: one dispatch pass per subscription type (Pulsar's dispatchers).

Each pass hands out as much as the consumers' capacities (``Consumer.capacity()``: permits, bounded by
``max_unacked``) allow, redeliveries before new messages, and starts from a rotating partition so a
consumer holding a single permit (a zero-queue consumer) is served from every partition in turn.

- Exclusive / Failover: each partition's active consumer takes it in offset order.
- Shared: round-robin, ``SHARED_BATCH`` messages at a time, among consumers with capacity.
- Key_Shared: a message goes to the owner of its key hash, and only if no *other* consumer still holds
  unacknowledged messages of that hash (Pulsar 4's draining hashes: after ranges move, only hashes
  in flight at their previous owner wait); once a message of a hash must wait, every later message of
  that hash waits too (per-key order), while other hashes keep flowing.

Caller: ``Subscription._finish``; pure like it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Collection
from itertools import islice
from typing import Protocol

from sluice.dispatcher.consumer import Consumer
from sluice.dispatcher.keyindex import KeyedReadAhead
from sluice.dispatcher.messages import Message, offset_of
from sluice.dispatcher.model import SubscriptionSettings, SubscriptionType
from sluice.dispatcher.parking import Parking
from sluice.dispatcher.partition_state import PartitionState

__all__ = ["SHARED_BATCH", "Dispatchable", "dispatch"]


class Dispatchable(Protocol):
    """What a dispatch pass reads and changes of a subscription (``Subscription`` is one). A protocol,
    so that the selectors depend on the state's shape and the state machine imports the selectors,
    not the other way round."""

    settings: SubscriptionSettings
    partitions: dict[int, PartitionState]
    consumers: dict[str, Consumer]
    #: The partition served last, and the next consumer's index in the Shared ring.
    partition_rr: int
    consumer_rr: int
    #: Key_Shared: the owner of each key hash, and the consumer still holding a hash's messages.
    owner_table: list[Consumer | None]
    hash_holder: dict[int, Consumer]
    #: Key_Shared poison isolation: later messages of a parked key wait there (``parking.py``).
    parking: Parking

    def deliver(self, c: Consumer, ps: PartitionState, msgs: list[Message], now_ms: int) -> None: ...


#: Messages handed to one Shared consumer before moving to the next (Pulsar's round-robin batch is 20;
#: larger chunks cost less per message and still spread evenly).
SHARED_BATCH = 50


def _rotated(sub: Dispatchable) -> list[PartitionState]:
    """Partitions with work, starting after the one served last (``Subscription.deliver`` records it)."""
    parts = [ps for ps in sub.partitions.values() if ps.replay or ps.pending or ps.keyed]
    gated = [ps for ps in parts if not ps.has_work()]
    if gated:
        # Everything these read is beyond the persisted delivered-up-to mark: ask for a flush.
        if any(c.capacity() for c in sub.consumers.values()):
            for ps in gated:
                ps.cursor.stall(ps.pending[0].offset)
        parts = [ps for ps in parts if ps not in gated]
    if len(parts) > 1:
        parts.sort(key=lambda ps: ps.partition)
        last = sub.partition_rr
        k = next((i for i, ps in enumerate(parts) if ps.partition > last), 0)
        parts = parts[k:] + parts[:k]
    return parts


def dispatch(sub: Dispatchable, now_ms: int) -> None:
    kind = sub.settings.type
    if kind == SubscriptionType.SHARED:
        _shared(sub, now_ms)
    elif kind == SubscriptionType.KEY_SHARED:
        _key_shared(sub, now_ms)
    else:
        _single_active(sub, now_ms)


def _single_active(sub: Dispatchable, now_ms: int) -> None:
    for ps in _rotated(sub):
        c = ps.active
        if c is None:
            continue
        n = c.capacity()
        if n:
            msgs = ps.take_ordered(n)
            if msgs:
                sub.deliver(c, ps, msgs, now_ms)


def _next_consumer(sub: Dispatchable, ring: list[Consumer], partition: int) -> Consumer | None:
    """The next consumer in round-robin order with capacity that serves ``partition``."""
    n = len(ring)
    start = sub.consumer_rr
    for i in range(n):
        c = ring[(start + i) % n]
        if c.serves(partition) and c.capacity():
            sub.consumer_rr = (start + i + 1) % n
            return c
    return None


def _shared(sub: Dispatchable, now_ms: int) -> None:
    ring = sorted(sub.consumers.values(), key=lambda c: c.join_seq)
    parts = _rotated(sub)
    while parts:
        still: list[PartitionState] = []
        for ps in parts:
            c = _next_consumer(sub, ring, ps.partition)
            if c is None:
                continue
            msgs = ps.take_ordered(min(c.capacity(), SHARED_BATCH))
            if msgs:
                sub.deliver(c, ps, msgs, now_ms)
            if msgs and ps.has_work():
                still.append(ps)
        parts = still


def _key_shared(sub: Dispatchable, now_ms: int) -> None:
    table = sub.owner_table
    if not table:
        return
    caps: dict[Consumer, int] = {c: c.capacity() for c in sub.consumers.values()}
    if not any(caps.values()):
        return
    # Hashes with a message waiting out its nack delay wait too: nothing may overtake it.
    blocked: set[int] = {m.key_hash for ps in sub.partitions.values() for m in ps.delayed.values()}
    parking = sub.parking
    run = _KeySharedPass(table, sub.hash_holder, caps, blocked, parking if parking.keys else None, parking.on)
    for ps in _rotated(sub):
        out: dict[Consumer, list[Message]] = {}
        if ps.replay:
            run.take_replay(ps, out)
        if (ps.pending or ps.keyed) and any(caps.values()):
            run.take_pending(ps, out)
        for c, msgs in out.items():
            sub.deliver(c, ps, msgs, now_ms)
        if not any(caps.values()):
            return


class _KeySharedPass:
    """What one Key_Shared pass carries from partition to partition: the consumers' capacities left
    and the hashes that must wait (``blocked``: once a message of a hash waits, every later one of
    that hash waits too, in every partition)."""

    __slots__ = ("blocked", "caps", "holder", "parking", "parking_on", "table")

    def __init__(
        self,
        table: list[Consumer | None],
        holder: dict[int, Consumer],
        caps: dict[Consumer, int],
        blocked: set[int],
        parking: Parking | None,
        parking_on: bool = False,
    ) -> None:
        self.table = table
        self.holder = holder
        self.caps = caps
        self.blocked = blocked
        #: Set only while some key is parked: then each message's key is looked up (one dict probe).
        self.parking = parking
        #: Parking is enabled (``keyindex.py`` then counts filed messages per hash).
        self.parking_on = parking_on

    def eligible(self, m: Message, p: int) -> Consumer | None:
        """The consumer ``m`` (of partition ``p``) goes to now, or None (its hash then waits)."""
        h = m.key_hash
        blocked = self.blocked
        if h in blocked:
            return None
        c = self.table[h]
        if c is None or not self.caps.get(c) or not c.serves(p):
            blocked.add(h)
            return None
        held_by = self.holder.get(h)
        if held_by is not None and held_by is not c:
            blocked.add(h)  # draining: the previous owner still holds this hash
            return None
        return c

    def take_replay(self, ps: PartitionState, out: dict[Consumer, list[Message]]) -> None:
        """Redeliveries first, in offset order."""
        replay, caps, p, parking = ps.replay, self.caps, ps.partition, self.parking
        parked = parking.hashes if parking is not None else ()
        for o in sorted(replay):
            m = replay[o]
            if m.key_hash in parked and parking is not None and parking.take(m):
                del replay[o]
                continue
            c = self.eligible(m, p)
            if c is not None:
                del replay[o]
                out.setdefault(c, []).append(m)
                caps[c] -= 1
        ps.replay_heap = sorted(replay)

    def take_pending(self, ps: PartitionState, out: dict[Consumer, list[Message]]) -> None:
        """New messages in order, up to the persisted delivered-up-to mark; those not taken stay.

        The read-ahead below the gate is filed by owner first (``keyindex.py``, once per message),
        then only the queues of consumers with capacity are walked, each until its capacity is used:
        what each consumer gets is what the plain scan in offset order gives it (its first eligible
        messages; the hashes that wait are the same), at a cost of what is sent plus what waits ahead
        of it, not of the whole read-ahead."""
        keyed = ps.keyed
        if keyed is None or (not keyed and (keyed.filed is not None) != self.parking_on):
            keyed = ps.keyed = KeyedReadAhead(self.parking_on)
        caps, p = self.caps, ps.partition
        parking = self.parking
        filed = keyed.filed
        parked = parking.hashes if parking is not None else ()
        gone_bytes = 0
        pending = ps.pending
        if pending:
            gone_bytes += self._file(ps, keyed, parked)
        eligible = self.eligible
        for c, q in keyed.queues.items():
            if not q or c is None:
                continue  # hashes nobody owns wait; the plain scan only marked them waiting
            if not c.serves(p):
                # The plain scan marks every such hash waiting for the rest of the pass (other
                # partitions included): do the same (rare: a consumer restricted to partitions).
                gone_bytes += self._mark_waiting(keyed, q, parked)
                continue
            if not caps.get(c):
                continue  # its hashes cannot go to anyone else this pass
            kept: list[Message] = []
            took = caps[c]
            popleft = q.popleft
            sent = out.setdefault(c, [])
            before = len(sent)  # redeliveries to it may come first (``take_replay``)
            while q and caps[c]:
                m = popleft()
                h = m.key_hash
                if h in parked and parking is not None and parking.take(m):
                    gone_bytes += m.size
                    keyed.gone(h)
                    continue
                to = eligible(m, p)
                if to is None:
                    kept.append(m)
                    continue
                assert to is c, "filed under a stale owner: unfile() was missed on a table change"
                sent.append(m)
                gone_bytes += m.size
                caps[c] -= 1
            if filed is None:
                keyed.count -= took - caps[c]
            else:
                for m in islice(sent, before, None):
                    keyed.gone(m.key_hash)
            if kept:
                q.extendleft(reversed(kept))
            if not sent:
                del out[c]
        ps.pending_bytes -= gone_bytes
        if ps.pending and ps.pending[0].offset >= ps.cursor.gate and any(caps.values()):
            ps.cursor.stall(ps.pending[0].offset)  # beyond the mark: wait for the flush it asks for

    def _file(self, ps: PartitionState, keyed: KeyedReadAhead, parked: Collection[int]) -> int:
        """Move the read-ahead below the gate into ``keyed``; a message of a parked key goes to parking
        instead (off the read-ahead: it no longer holds the feed back). Returns the bytes parked."""
        pending, table, parking = ps.pending, self.table, self.parking
        gate = ps.cursor.gate
        n = len(pending)
        if pending[-1].offset >= gate:
            n = bisect_left(pending, gate, key=offset_of)
        parked_bytes = 0
        file = keyed.file
        popleft = pending.popleft
        filed = keyed.filed or ()  # a key with messages filed: the next waits behind them
        for _ in range(n):
            m = popleft()
            h = m.key_hash
            if parked and h in parked and h not in filed and parking is not None and parking.take(m):
                parked_bytes += m.size
                continue
            file(m, table[h])
        return parked_bytes

    def _mark_waiting(self, keyed: KeyedReadAhead, q: deque[Message], parked: Collection[int]) -> int:
        """A queue whose owner does not serve the partition: its hashes wait (parked keys' messages
        still go to parking). Returns the bytes parked."""
        parking, blocked = self.parking, self.blocked
        kept: list[Message] = []
        parked_bytes = 0
        for m in q:
            if parked and m.key_hash in parked and parking is not None and parking.take(m):
                parked_bytes += m.size
                keyed.gone(m.key_hash)
                continue
            blocked.add(m.key_hash)
            kept.append(m)
        if len(kept) != len(q):
            q.clear()
            q.extend(kept)
        return parked_bytes
