"""Per-key poison isolation under Key_Shared: a key whose message keeps failing is *parked*.

Pure, like the state machine it belongs to (``subscription.py``). SQS FIFO message groups are the
prior art: a failing message blocks its own group, never the queue.

- **Parking.** When a message comes back for the ``park_after``-th time (nack, ack timeout, its
  consumer leaving), its key is parked and that message becomes the key's *head*, retried as before;
  every *later* message of the key is taken out of the read-ahead and the redelivery queue and waits
  here, in (partition, offset) order. So the read-ahead never fills with one key's messages (Pulsar's
  Key_Shared stalls so, apache/pulsar#21579) and every other key flows at full speed.
- **Release.** The head is acknowledged: the key's waiting messages go back, in order, before any
  later message of the key (redeliveries go first).
- **Giving up.** The head comes back past ``max_redeliver``: with the DLQ policy the head and every
  waiting message of the key go to the DLQ in order (once no message of the key is in flight any
  more, so nothing of the key overtakes them); with the hold policy (``park_hold``) the head waits
  too, and the key stays parked until an operator unparks it (``unpark``: counts start again) or it
  passes the cap. After the DLQ the key stays parked and *probes*: its next message is the new head,
  tried alone; acknowledged, the key is released; failing, the cycle repeats.
- **Cap.** A key with more than ``park_max_messages`` waiting goes to the DLQ whatever the policy, and
  past ``park_max_bytes`` parked over all keys the largest key does: bounded memory and storage (the
  caps plus what one dispatch pass found in the read-ahead, charged to the memory budget).

Where parked messages live: in the subscription's parking store, ``<topic>.<subscription>.PARK``
(``parkstore.py``; ``docs/poison-keys.md``), and here. Every message that parks (each head, and
everything waiting behind one) is *stored*: a ``park`` event is emitted (``events``, written in order by
the runtime), and once the store acknowledged it the cursor acknowledges its offset
(``Subscription.parks_saved``). From then on its failures are counted here (``counts``, ``fail``
events), and it stays in the store until it is finished (acknowledged after its release, or
dead-lettered): a ``resolved`` event per (partition, key) prefix (``trackers``). A restart replays it.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Protocol

from sluice.dispatcher.consumer import Consumer
from sluice.dispatcher.messages import Message
from sluice.dispatcher.model import (
    Effects,
    ParkEvent,
    SubscriptionSettings,
    SubscriptionState,
    SubscriptionType,
)
from sluice.dispatcher.partition_state import PartitionState
from sluice.dispatcher.timers import TimerHeap

__all__ = ["PROBE_IDLE_MS", "ParkState", "ParkedKey", "Parking", "key_of"]

#: A probing key (it went to the DLQ) with no message for this long is forgotten.
PROBE_IDLE_MS = 10_000


def key_of(m: Message) -> bytes:
    """The message's key (keyless messages share the empty key, as they share one hash)."""
    return m.view.key(m.index) or b""


def _pos(m: Message) -> tuple[int, int]:
    return (m.partition, m.offset)


class ParkState(enum.Enum):
    #: The head is retried; later messages wait.
    PARKED = "parked"
    #: The head is past max_redeliver under the hold policy: everything waits for an operator.
    HELD = "held"
    #: To the DLQ, head first, as soon as no message of the key is in flight.
    DLQ = "dlq"


@dataclass(slots=True)
class ParkedKey:
    key: bytes
    key_hash: int
    since_ms: int
    #: (partition, offset) of the failing message; None while probing (below).
    head: tuple[int, int] | None
    #: Waiting messages in (partition, offset) order (the head too once it stopped being retried).
    waiting: list[Message] = field(default_factory=list)
    state: ParkState = ParkState.PARKED
    #: Past the cap: give up at the next chance whatever the policy.
    evict: bool = False
    #: When the key last went to the DLQ (0: never). It then stays parked and *probes*: its next
    #: message becomes the new head and is tried alone while the later ones wait, so a key that keeps
    #: failing costs one delivery per attempt of a head, not a burst of every message it has.
    probing_since: int = 0
    #: Bytes of ``waiting`` (``Message.size``), for the byte cap.
    nbytes: int = 0


class Parkable(Protocol):
    """What parking reads and changes of a subscription (``Subscription`` is one)."""

    settings: SubscriptionSettings
    state: SubscriptionState
    partitions: dict[int, PartitionState]
    hash_held: dict[int, int]
    hash_holder: dict[int, Consumer]
    fx: Effects
    timers: TimerHeap[tuple[object, ...]]


Pos = tuple[int, int]


class Parking:
    """The parked keys of one subscription. Caller: ``Subscription`` and ``selectors``."""

    __slots__ = (
        "byte_cap",
        "bytes_total",
        "cap",
        "counts",
        "dlq_pos",
        "dropped",
        "events",
        "hashes",
        "keys",
        "on",
        "stored",
        "trackers",
        "waiting_total",
    )

    def __init__(self, cap: int = 10_000, byte_cap: int = 0) -> None:
        #: Whether the subscription parks keys at all (``enabled``).
        self.on = False
        self.keys: dict[bytes, ParkedKey] = {}
        #: The key hashes of ``keys``: a message whose (cached) hash is not here is not parked, so
        #: the other keys pay one set probe, not a key decode (``take``).
        self.hashes: dict[int, int] = {}
        self.cap = cap
        #: Bytes parked over every key beyond which the largest key goes to the DLQ (0: no cap).
        self.byte_cap = byte_cap
        self.bytes_total = 0
        #: Messages waiting over every key (a gauge).
        self.waiting_total = 0
        #: (partition, offset) of every message in the parking store (or on its way there) and not
        #: finished yet: the cursor no longer tracks them (module docstring).
        self.stored: set[Pos] = set()
        #: Failures of stored messages (heads), counted here since the cursor acknowledged them.
        self.counts: dict[Pos, int] = {}
        #: Per (partition, key): the stored offsets not yet resolved, in order.
        self.trackers: dict[tuple[int, bytes], list[int]] = {}
        #: Stored messages handed to the DLQ (their ``resolved`` event says ``dlq``).
        self.dlq_pos: set[Pos] = set()
        #: Events for the store, in order; ``Subscription._finish`` moves them into its effects.
        self.events: list[ParkEvent] = []
        #: A partition was dropped (moved away): the store's kept state may miss its next owner's events.
        self.dropped = False

    @staticmethod
    def enabled(settings: SubscriptionSettings) -> bool:
        return settings.park_after > 0 and settings.type == SubscriptionType.KEY_SHARED

    @classmethod
    def of(cls, settings: SubscriptionSettings) -> Parking:
        parking = cls(settings.park_max_messages, settings.park_max_bytes)
        parking.on = cls.enabled(settings)
        return parking

    def _new(self, pk: ParkedKey) -> ParkedKey:
        self.keys[pk.key] = pk
        self.hashes[pk.key_hash] = self.hashes.get(pk.key_hash, 0) + 1
        return pk

    def _forget(self, pk: ParkedKey) -> None:
        del self.keys[pk.key]
        n = self.hashes[pk.key_hash] - 1
        if n:
            self.hashes[pk.key_hash] = n
        else:
            del self.hashes[pk.key_hash]

    def _store(self, m: Message, key: bytes, count: int = 0) -> None:
        """``m`` goes to the store (once): a ``park`` event (then ``saved``)."""
        pos = _pos(m)
        if pos in self.stored:
            return
        self.stored.add(pos)
        if count:
            self.counts[pos] = count
        bisect.insort(self.trackers.setdefault((m.partition, key), []), m.offset)
        self.events.append(ParkEvent("park", m.partition, m.offset, key, m, count))

    def _add(self, pk: ParkedKey, m: Message) -> None:
        w = pk.waiting
        at = bisect.bisect_left(w, _pos(m), key=_pos)
        if at < len(w) and _pos(w[at]) == _pos(m):
            return
        self._store(m, pk.key)
        w.insert(at, m)
        self.waiting_total += 1
        pk.nbytes += m.size
        self.bytes_total += m.size
        if len(w) > self.cap:
            pk.evict = True
        if self.byte_cap and self.bytes_total > self.byte_cap:
            # Over the subscription's byte cap: its largest key goes to the DLQ (usually the poison
            # key that filled it), whatever the policy.
            max(self.keys.values(), key=attrgetter("nbytes")).evict = True

    def adopt(self, pk: ParkedKey, m: Message) -> None:
        """``m``, replayed from the store after a restart (``parkrestore.py``), waits behind ``pk``."""
        self.stored.add(_pos(m))
        bisect.insort(self.trackers.setdefault((m.partition, pk.key), []), m.offset)
        self._add(pk, m)

    def _shrink(self, pk: ParkedKey, kept: list[Message]) -> None:
        """``pk.waiting`` becomes ``kept``: the gauges follow."""
        self.waiting_total -= len(pk.waiting) - len(kept)
        n = sum(m.size for m in kept)
        self.bytes_total -= pk.nbytes - n
        pk.nbytes = n
        pk.waiting = kept

    def take(self, m: Message) -> bool:
        """A message about to be dispatched (selectors): if its key is parked and it is not the head,
        it waits here (True). Only called while some key is parked.

        Past the cap a message is still taken (the key is then flagged to go to the DLQ): it was
        read already, so it costs no more memory here than in the read-ahead, and leaving it there
        would fill the read-ahead and stall every key (measured: the good keys at half their speed)."""
        if m.key_hash not in self.hashes:
            return False
        pk = self.keys.get(key_of(m))
        if pk is None or pk.head == _pos(m):
            return False
        if pk.head is None and not pk.waiting and pk.state == ParkState.PARKED:
            pk.head = _pos(m)  # probing: the next message of the key is tried, alone
            self._store(m, pk.key)  # a head is stored too: after a crash it stays ahead of the rest
            return False
        self._add(pk, m)
        return True

    def on_return(self, sub: Parkable, m: Message, count: int, limit: int, now_ms: int) -> bool:
        """A message came back unacknowledged with ``count``: park its key, or keep it waiting, or
        give up on the key. True if parking took the message (the caller does nothing more)."""
        key = key_of(m)
        pk = self.keys.get(key)
        exhausted = bool(limit) and count > limit
        if pk is None:
            if count >= sub.settings.park_after and not exhausted:
                self._new(ParkedKey(key, m.key_hash, now_ms, _pos(m)))
                self._store(m, key, count)
            return False
        if pk.head != _pos(m):
            self._add(pk, m)
            return True
        if not (exhausted or pk.evict):
            return False
        self._add(pk, m)
        pk.state = ParkState.HELD if sub.settings.park_hold and not pk.evict else ParkState.DLQ
        return True

    def back(
        self, sub: Parkable, ps: PartitionState, m: Message, limit: int, delay_ms: int, now_ms: int
    ) -> bool:
        """A message came back unacknowledged: if it is stored (the cursor acknowledged it), parking
        counts the failure and decides (True); otherwise the cursor counts it (False, ``on_return``)."""
        pos = _pos(m)
        if pos not in self.stored:
            return False
        sub.fx.redelivered += 1
        key = key_of(m)
        pk = self.keys.get(key)
        if pk is not None and pk.head != pos:
            self._add(pk, m)  # it waits behind the head
            return True
        count = self.counts.get(pos, 0) + 1
        self.counts[pos] = count
        self.events.append(ParkEvent("fail", m.partition, m.offset, key, count=count))
        if pk is None:  # a released message failed again: its key parks again, with it as the head
            pk = self._new(ParkedKey(key, m.key_hash, now_ms, pos))
        if (limit and count > limit) or pk.evict:
            self._add(pk, m)
            pk.state = ParkState.HELD if sub.settings.park_hold and not pk.evict else ParkState.DLQ
        elif delay_ms > 0:
            ps.delayed[m.offset] = m
            sub.timers.push(now_ms + delay_ms, ("nack", ps.partition, m.offset))
        else:
            ps.add_replay(m)
        return True

    def saved(self, sub: Parkable, saved: dict[int, list[int]]) -> None:
        """The store holds these messages: the cursor acknowledges them (its mark-delete moves on)."""
        for p, offsets in saved.items():
            ps = sub.partitions.get(p)
            if ps is not None:
                ps.cursor.ack_sorted(sorted(set(offsets)))

    def cursor_owned(self, partition: int, offsets: list[int]) -> list[int]:
        """``offsets`` without the stored ones (the cursor does not count those)."""
        stored = self.stored
        return [o for o in offsets if (partition, o) not in stored] if stored else offsets

    def counts_of(self, partition: int, offsets: list[int], counts: list[int] | None) -> list[int] | None:
        """A delivery's counts, stored heads' from ``counts`` (only the few heads are looked at)."""
        lo, hi = min(offsets), max(offsets)
        hits = [(o, n) for (p, o), n in self.counts.items() if p == partition and lo <= o <= hi]
        if not hits:
            return counts
        out = list(counts) if counts is not None else [0] * len(offsets)
        at = {o: i for i, o in enumerate(offsets)}
        for o, n in hits:
            i = at.get(o)
            if i is not None:
                out[i] = n
        return out

    def _done(self, ps: PartitionState, o: int) -> bool:
        """Whether the head at ``o`` was acknowledged (stored: it is nowhere any more; a probing head
        may still wait in the read-ahead, blocked behind its hash)."""
        if (ps.partition, o) not in self.stored:
            return ps.cursor.is_acked(o)
        if o in ps.inflight or o in ps.replay or o in ps.delayed or o in ps.dead:
            return False
        return not ps.holds_pending(o)

    def _finished(self, ps: PartitionState, key: bytes, o: int) -> bool:
        """Whether the stored message at ``o`` is finished (acknowledged, or dead-lettered): nowhere."""
        pk = self.keys.get(key)
        if pk is not None:
            if pk.head == (ps.partition, o):
                return False
            w = pk.waiting
            at = bisect.bisect_left(w, (ps.partition, o), key=_pos)
            if at < len(w) and _pos(w[at]) == (ps.partition, o):
                return False
        return self._done(ps, o)

    def resolve(self, sub: Parkable) -> None:
        """Record finished stored messages: per (partition, key), the longest finished prefix of its
        stored offsets becomes one ``resolved`` event (the store's replay drops them). Only the
        front of each is looked at: the cost is per key, not per message."""
        if sub.state != SubscriptionState.ACTIVE:
            return  # unloading: queues were dropped, nothing finished
        for tk, offs in list(self.trackers.items()):
            p, key = tk
            ps = sub.partitions.get(p)
            if ps is None:
                continue
            n = 0
            while n < len(offs) and self._finished(ps, key, offs[n]):
                n += 1
            if not n:
                continue
            how = "ok"
            for o in offs[:n]:
                self.stored.discard((p, o))
                self.counts.pop((p, o), None)
                if (p, o) in self.dlq_pos:
                    self.dlq_pos.discard((p, o))
                    how = "dlq"
            self.events.append(ParkEvent("resolved", p, offs[n - 1], key, how=how))
            del offs[:n]
            if not offs:
                del self.trackers[tk]

    def settle(self, sub: Parkable, now_ms: int) -> None:
        """Release keys whose head was acknowledged; send given-up keys to the DLQ; start probing keys'
        next heads. Called before each dispatch pass while some key is parked (a handful: cheap)."""
        for key, pk in list(self.keys.items()):
            if pk.state == ParkState.PARKED and pk.head is None:
                self._probe(sub, pk, now_ms)
                continue
            if pk.state == ParkState.PARKED:
                assert pk.head is not None
                p, o = pk.head
                ps = sub.partitions.get(p)
                if ps is None or self._done(ps, o):
                    self.release(sub, key, fresh=False)
                    continue
                if pk.evict:
                    head = ps.delayed.pop(o, None) or ps.replay.pop(o, None)
                    if head is None:
                        continue  # in flight: given up at its return
                    self._add(pk, head)
                    pk.state = ParkState.DLQ
            elif pk.evict:
                pk.state = ParkState.DLQ
            if pk.state == ParkState.DLQ and not self._in_flight(sub, pk):
                self._dead_letter(sub, pk, now_ms)
        if self.trackers:
            self.resolve(sub)

    @staticmethod
    def _in_flight(sub: Parkable, pk: ParkedKey) -> bool:
        """Whether a message of the key is still at a consumer (it would overtake the DLQ'd ones). The
        hash's holder is scanned only when the hash is held at all, so a busy key sharing the hash
        does not keep the parked one from the DLQ."""
        holder = sub.hash_holder.get(pk.key_hash) if sub.hash_held.get(pk.key_hash) else None
        if holder is None:
            return False
        h, key = pk.key_hash, pk.key
        return any(
            m.key_hash == h and key_of(m) == key for msgs in holder.inflight.values() for m in msgs.values()
        )

    def _probe(self, sub: Parkable, pk: ParkedKey, now_ms: int) -> None:
        """A probing key: the lowest waiting message (one that came back from a consumer after the
        key went to the DLQ) becomes the head; a key with nothing more for ``PROBE_IDLE_MS`` is
        forgotten (its next failure parks it again)."""
        if pk.waiting:
            m = pk.waiting[0]
            self._shrink(pk, pk.waiting[1:])
            pk.head = _pos(m)
            ps = sub.partitions.get(m.partition)
            if ps is not None:
                ps.add_replay(m)
        elif now_ms - pk.probing_since >= PROBE_IDLE_MS:
            self._forget(pk)

    def _dead_letter(self, sub: Parkable, pk: ParkedKey, now_ms: int) -> None:
        for m in pk.waiting:
            ps = sub.partitions.get(m.partition)
            if ps is not None:
                ps.dead[m.offset] = m
                pos = _pos(m)
                if pos in self.stored:
                    self.dlq_pos.add(pos)
                count = self.counts.get(pos) or ps.cursor.redelivery_count(m.offset)
                sub.fx.dead_letters.append((m, count))
        self._shrink(pk, [])
        pk.head = None
        pk.state = ParkState.PARKED
        pk.evict = False
        pk.probing_since = now_ms

    def release(self, sub: Parkable, key: bytes, fresh: bool) -> ParkedKey | None:
        """Unpark ``key``: its waiting messages go back for redelivery, in order. ``fresh`` (an
        operator's unpark): their redelivery counts start again from 0."""
        pk = self.keys.get(key)
        if pk is None:
            return None
        self._forget(pk)
        waiting = pk.waiting
        self._shrink(pk, [])
        if fresh:
            self.events.append(ParkEvent("unpark", -1, -1, key))
        for m in waiting:
            ps = sub.partitions.get(m.partition)
            if ps is None:
                continue
            if fresh:
                self.counts.pop(_pos(m), None)
                if ps.cursor.redelivery_count(m.offset):
                    ps.cursor.redeliveries[m.offset] = 0
                    ps.cursor.version += 1
            ps.add_replay(m)
        return pk

    def hold(self, sub: Parkable, m: Message, now_ms: int, count: int = 0) -> None:
        """Read again after a restart with a count (``count``) already past the limit, under the hold
        policy: the message waits for an operator (instead of going straight to the DLQ)."""
        key = key_of(m)
        pk = self.keys.get(key)
        if pk is None:
            pk = self._new(ParkedKey(key, m.key_hash, now_ms, _pos(m), state=ParkState.HELD))
        self._store(m, key, count)  # with its count: held again after another restart
        self._add(pk, m)

    def holds(self, m: Message) -> bool:
        """Whether ``m``'s key is held (it must not overtake the held messages)."""
        if m.key_hash not in self.hashes:
            return False
        pk = self.keys.get(key_of(m))
        return pk is not None and pk.state == ParkState.HELD

    def drop_partition(self, sub: Parkable, partition: int) -> None:
        """The partition is no longer served: forget its waiting messages (they stay in the store); a
        key whose head was there is released (its other messages go back)."""
        self.dropped = True
        for key, pk in list(self.keys.items()):
            self._shrink(pk, [m for m in pk.waiting if m.partition != partition])
            if pk.head is not None and pk.head[0] == partition:
                self.release(sub, key, fresh=False)
        # Its stored messages stay in the store, unresolved: the partition's next owner replays them.
        for tk in [tk for tk in self.trackers if tk[0] == partition]:
            for o in self.trackers.pop(tk):
                self.stored.discard((partition, o))
                self.counts.pop((partition, o), None)
                self.dlq_pos.discard((partition, o))

    def messages(self) -> Iterator[Message]:
        for pk in self.keys.values():
            yield from pk.waiting

    def oldest_ms(self) -> int | None:
        return min((pk.since_ms for pk in self.keys.values()), default=None)
