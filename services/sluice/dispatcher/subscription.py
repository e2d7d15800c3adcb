"""The subscription state machine: one (topic, subscription) on the partitions this dispatcher serves.

Pure: no I/O and no clock. Every public method takes ``now_ms``, changes state and returns
:class:`~sluice.dispatcher.model.Effects` for the service layer to carry out. Who gets which message
is decided by the type, in ``selectors.py``; this module owns the shared bookkeeping: per partition
(``partition_state.py``: cursor, read position, messages by state), per consumer (``consumer.py``:
permits, unacked, blocked), one timer heap, one memory account (``budget.py``), and the parked keys
of Key_Shared poison isolation (``parking.py``).

Redelivery counts live in the cursor, so they survive a restart (plus one for a message that may have
been delivered before a crash). For that, a durable cursor gates deliveries (``cursor.py``): new
messages go out only below its persisted delivered-up-to mark, and a message whose count was raised
goes out again only once that count is persisted (until then it waits in ``delayed``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from itertools import repeat

from sluice.dispatcher import model, selectors
from sluice.dispatcher.budget import SubscriptionMemory
from sluice.dispatcher.consumer import Consumer, ConsumerSpec, ConsumerState, check_join
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.keyshared import AutoSplitRanges, StickyRanges
from sluice.dispatcher.messages import Message, offset_of
from sluice.dispatcher.model import Effects, SubscriptionSettings, SubscriptionState, SubscriptionType
from sluice.dispatcher.parking import Parking
from sluice.dispatcher.parkrestore import past_limit
from sluice.dispatcher.partition_state import PartitionState, unbudgeted
from sluice.dispatcher.timers import TimerHeap
from sluice.errors import InvalidRequest

__all__ = ["Subscription"]

# Timer items: ("nack", partition, offset) or ("ack", consumer, partition, offsets, delivery_seq).
TimerItem = tuple[object, ...]
Account = SubscriptionMemory | None


class Subscription:
    """One (topic, subscription) on this dispatcher."""

    def __init__(self, topic: str, name: str, settings: SubscriptionSettings, memory: Account = None) -> None:
        self.topic = topic
        self.name = name
        self.settings = settings
        self.memory = memory or unbudgeted()
        self.state = SubscriptionState.LOADING
        self.partitions: dict[int, PartitionState] = {}
        self.consumers: dict[str, Consumer] = {}
        self._join_seq = itertools.count()
        self._delivery_seq = itertools.count(1)
        self.timers: TimerHeap[TimerItem] = TimerHeap()
        # Rotation points so that permits are shared fairly between partitions and consumers: the
        # partition served last, and the next consumer's index in the Shared ring.
        self.partition_rr = -1
        self.consumer_rr = 0
        # Key_Shared: hash ownership, and the consumer still holding unacknowledged messages of a hash.
        self.ranges: AutoSplitRanges | StickyRanges = StickyRanges() if settings.sticky else AutoSplitRanges()
        self.owner_table: list[Consumer | None] = []
        self.hash_holder: dict[int, Consumer] = {}
        self.hash_held: dict[int, int] = {}
        #: Key_Shared poison isolation (``parking.py``); ``parking.on`` when the settings enable it.
        self.parking = Parking.of(settings)
        self.fx = Effects()

    # ---- lifecycle ----------------------------------------------------------------------------------

    def transition(self, to: SubscriptionState) -> None:
        assert to in model.SUBSCRIPTION_TRANSITIONS.get(self.state, set()), (
            f"subscription {self.state} -> {to}"
        )
        self.state = to

    def attach_partition(self, cursor: PartitionCursor, read_position: int) -> None:
        """Serve a partition from ``read_position`` (the cursor says what below it is acked)."""
        position = max(read_position, cursor.mark_delete)
        self.partitions[cursor.partition] = PartitionState(cursor, position, self.memory)

    def activate(self, now_ms: int) -> Effects:
        self.transition(SubscriptionState.ACTIVE)
        return self._finish(now_ms)

    def detach_partition(self, partition: int, now_ms: int) -> Effects:
        """Stop serving a partition (moved to another dispatcher): forget its in-flight and parked."""
        ps = self.partitions.pop(partition, None)
        if ps is not None:
            ps.release_all()
            self.parking.drop_partition(self, partition)
            for c in self.consumers.values():
                gone = c.inflight.pop(partition, None)
                if gone:
                    for m in gone.values():
                        self._release_hash(c, m)
                    c.on_released(len(gone))
                if partition in c.active_partitions:
                    c.active_partitions.discard(partition)
                    self.fx.active_changes.append((c.consumer_id, partition, False))
        return self._finish(now_ms)

    def close(self) -> None:
        """Unload: what is in flight counts as returned (``PartitionCursor.settle``): cursors stay exact."""
        if self.state != SubscriptionState.CLOSED:
            self.transition(SubscriptionState.CLOSED)
            for ps in self.partitions.values():
                ps.cursor.settle(self.parking.cursor_owned(ps.partition, sorted(ps.inflight)))
                ps.release_all()  # its messages go now, not when a gc pass finds the runtime's cycles
            self.memory.release_all()

    def cursors_saved(self, now_ms: int) -> Effects:
        """The service persisted cursors of this subscription: gates opened, counts are stored."""
        for ps in self.partitions.values():
            ps.release_saved()
        return self._finish(now_ms)

    # ---- consumers ----------------------------------------------------------------------------------

    def check_join(self, spec: ConsumerSpec, settings: SubscriptionSettings) -> None:
        """Raise the typed error a Subscribe with these values would get; change nothing."""
        check_join(self.topic, self.name, self.settings, self.consumers.values(), spec, settings)

    def add_consumer(
        self, spec: ConsumerSpec, settings: SubscriptionSettings, now_ms: int
    ) -> tuple[Consumer, Effects]:
        """Add (or, for a known consumer_id, replace) a consumer. Raises as :meth:`check_join`.

        A replaced consumer (a reconnect) is closed and its unacknowledged messages go back to the
        subscription, exactly as on a disconnect.
        """
        self.check_join(spec, settings)
        old = self.consumers.get(spec.consumer_id)
        if old is not None:
            self._drop_consumer(old, now_ms)
        if not self.consumers and settings != self.settings:
            self._replace_settings(settings)
        c = Consumer(spec, next(self._join_seq))
        self.consumers[spec.consumer_id] = c
        if self.settings.type == SubscriptionType.KEY_SHARED:
            if isinstance(self.ranges, StickyRanges):
                assert spec.sticky_ranges is not None
                self.ranges.add(c.consumer_id, spec.sticky_ranges)
            else:
                self.ranges.add(c.consumer_id)
            self._rebuild_owner_table()
        if self.settings.type in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            self._reassign_active(now_ms, joined=c)
        return c, self._finish(now_ms)

    def remove_consumer(self, consumer: Consumer, now_ms: int) -> Effects:
        """The consumer's stream ended. A consumer already replaced by a reconnect is ignored."""
        if self.consumers.get(consumer.consumer_id) is consumer:
            self._drop_consumer(consumer, now_ms)
        return self._finish(now_ms)

    def _drop_consumer(self, c: Consumer, now_ms: int) -> None:
        del self.consumers[c.consumer_id]
        c.transition(ConsumerState.CLOSED)
        for partition, msgs in c.inflight.items():
            ps = self.partitions.get(partition)
            if ps is None:
                continue
            for o in sorted(msgs):
                m = msgs[o]
                del ps.inflight[o]
                ps.delivery_seq.pop(o, None)
                self._release_hash(c, m)
                self._return(ps, m, c, 0, now_ms, bump=True)
        c.inflight.clear()
        c.unacked = 0
        if self.settings.type == SubscriptionType.KEY_SHARED:
            self.ranges.remove(c.consumer_id)
            self._rebuild_owner_table()
        if self.settings.type in (SubscriptionType.EXCLUSIVE, SubscriptionType.FAILOVER):
            for p in c.active_partitions:
                ps = self.partitions.get(p)
                if ps is not None and ps.active is c:
                    ps.active = None
            c.active_partitions.clear()
            self._reassign_active(now_ms)

    def _replace_settings(self, settings: SubscriptionSettings) -> None:
        """An empty subscription takes the settings of its new first consumer."""
        self.settings = settings
        self.ranges = StickyRanges() if settings.sticky else AutoSplitRanges()
        self.owner_table = []
        self.parking = Parking.of(settings)

    def _rebuild_owner_table(self) -> None:
        self.owner_table = [self.consumers.get(cid) if cid else None for cid in self.ranges.owner_table()]
        list(map(PartitionState.unfile, self.partitions.values()))  # filed by the old owners (keyindex.py)

    def _reassign_active(self, now_ms: int, joined: Consumer | None = None) -> None:
        """Exclusive/Failover: pick each partition's active consumer; report changes.

        Failover: among the consumers serving the partition, those with the best (lowest) priority,
        sorted by name then id; partition p goes to the (p mod n)-th, so partitions spread.
        """
        fx = self.fx
        consumers = sorted(
            self.consumers.values(), key=lambda c: (c.spec.priority, c.spec.name, c.consumer_id)
        )
        for p, ps in sorted(self.partitions.items()):
            cands = [c for c in consumers if c.serves(p)]
            new: Consumer | None = None
            if cands:
                best = cands[0].spec.priority
                top = [c for c in cands if c.spec.priority == best]
                new = top[p % len(top)]
            old = ps.active
            if new is old:
                if joined is not None and joined.serves(p) and joined is not new:
                    fx.active_changes.append((joined.consumer_id, p, False))
                continue
            if old is not None:
                # The old active consumer's unacknowledged messages go to the new one, in order. Not
                # counted as redeliveries: the consumer did nothing wrong.
                msgs = old.inflight.pop(p, {})
                for o in sorted(msgs):
                    del ps.inflight[o]
                    ps.delivery_seq.pop(o, None)
                    self._return(ps, msgs[o], old, 0, now_ms, bump=False)
                if msgs:
                    old.on_released(len(msgs))
                old.active_partitions.discard(p)
                fx.active_changes.append((old.consumer_id, p, False))
            ps.active = new
            if new is not None:
                new.active_partitions.add(p)
                fx.active_changes.append((new.consumer_id, p, True))
            if joined is not None and joined.serves(p) and joined is not new:
                fx.active_changes.append((joined.consumer_id, p, False))

    # ---- flow, acks, nacks --------------------------------------------------------------------------

    def flow(self, consumer: Consumer, permits: int, now_ms: int) -> Effects:
        """Grant permits (validated > 0 by the caller)."""
        consumer.permits += permits
        return self._finish(now_ms)

    def ack(
        self, consumer: Consumer, by_partition: dict[int, list[int]], cumulative: bool, now_ms: int
    ) -> tuple[Effects, list[tuple[int, int]]]:
        """Acknowledge; returns the effects and the ids unknown or another consumer's. An id is accepted
        in flight at this consumer, waiting for redelivery, or already acknowledged (ignored).
        Cumulatively (Exclusive/Failover): the id must be accepted; then everything of its partition up
        to it that this consumer holds or that waits for redelivery is acknowledged."""
        if cumulative and self.settings.type in (SubscriptionType.SHARED, SubscriptionType.KEY_SHARED):
            raise InvalidRequest(
                f"cumulative acknowledgement is not allowed on a {self.settings.type.label} subscription: "
                "messages of one partition go to several consumers; acknowledge individually"
            )
        bad: list[tuple[int, int]] = []
        released = 0
        release = self._release_hash if self.settings.type == SubscriptionType.KEY_SHARED else None
        for p, given in by_partition.items():
            ps = self.partitions.get(p)
            if ps is None:
                bad += [(p, o) for o in given]
                continue
            offsets = given
            if cumulative:
                top = max(given)
                if not ps.ackable(consumer, top):
                    bad.append((p, top))
                    continue
                mine = consumer.inflight.get(p, {})
                chosen = {o for o in mine if o <= top}
                chosen.update(o for o in itertools.chain(ps.replay, ps.delayed) if o <= top)
                chosen.add(top)
                offsets = list(chosen)
            released += ps.ack(consumer, offsets, bad, release)
        if released:
            consumer.on_released(released)
        return self._finish(now_ms), bad

    def nack(
        self, consumer: Consumer, by_partition: dict[int, list[int]], now_ms: int
    ) -> tuple[Effects, list[tuple[int, int]]]:
        """Negative acknowledgement: redeliver after the consumer's nack delay (with backoff)."""
        bad: list[tuple[int, int]] = []
        released = 0
        spec = consumer.spec
        for p, offsets in by_partition.items():
            ps = self.partitions.get(p)
            if ps is None:
                bad += [(p, o) for o in offsets]
                continue
            cinf = consumer.inflight.get(p)
            for o in sorted(set(offsets)):
                if ps.inflight.get(o) is not consumer or cinf is None:
                    bad.append((p, o))
                    continue
                del ps.inflight[o]
                ps.delivery_seq.pop(o, None)
                m = cinf.pop(o)
                self._release_hash(consumer, m)
                released += 1
                count = ps.cursor.redelivery_count(o) + 1
                delay = spec.nack_delay_ms
                if spec.nack_backoff_max_ms and delay:
                    delay = min(delay << min(count - 1, 30), spec.nack_backoff_max_ms)
                self._return(ps, m, consumer, delay, now_ms, bump=True)
        if released:
            consumer.on_released(released)
        return self._finish(now_ms), bad

    def _return(
        self, ps: PartitionState, m: Message, c: Consumer, delay_ms: int, now_ms: int, bump: bool
    ) -> None:
        """A message went back unacknowledged: count it, then dead-letter, delay or replay it."""
        if self.parking.stored and self.parking.back(self, ps, m, c.spec.max_redeliver, delay_ms, now_ms):
            return  # stored (``parking.py``): parking counts it, not the cursor
        count = ps.cursor.bump_redelivery(m.offset) if bump else ps.cursor.redelivery_count(m.offset)
        limit = c.spec.max_redeliver
        self.fx.redelivered += 1
        if self.parking.on and self.parking.on_return(self, m, count, limit, now_ms):
            return
        if limit and count > limit:
            ps.dead[m.offset] = m
            self.fx.dead_letters.append((m, count))
        elif delay_ms > 0:
            ps.delayed[m.offset] = m
            self.timers.push(now_ms + delay_ms, ("nack", ps.partition, m.offset))
        else:
            ps.add_replay(m)

    def unpark(self, key: bytes, now_ms: int) -> Effects:
        """An operator released a parked key: its messages go again, counted from 0."""
        self.parking.release(self, key, fresh=True)
        return self._finish(now_ms)

    def parks_saved(self, saved: dict[int, list[int]], now_ms: int) -> Effects:
        """The parking store holds these messages: the cursor acknowledges them (``parking.py``)."""
        self.parking.saved(self, saved)
        return self._finish(now_ms)

    def dead_lettered(self, partition: int, offsets: Iterable[int], now_ms: int) -> Effects:
        """The DLQ producer stored these messages: acknowledge them."""
        ps = self.partitions.get(partition)
        if ps is not None:
            ps.dead_lettered(offsets)
        return self._finish(now_ms)

    # ---- reading -------------------------------------------------------------------------------------

    def read_position(self, partition: int) -> int | None:
        ps = self.partitions.get(partition)
        return None if ps is None else ps.read_position

    def wants(self, partition: int) -> bool:
        """Whether the feed should read more here (read-ahead not full; the runtime adds the budget)."""
        ps = self.partitions.get(partition)
        return (
            ps is not None
            and self.state == SubscriptionState.ACTIVE
            and ps.pending_bytes < self.settings.read_ahead_bytes
        )

    def offer(self, partition: int, messages: list[Message], next_offset: int, now_ms: int) -> Effects:
        """Records read from the log, in offset order, covering ``[first fetched, next_offset)``
        (``PartitionState.take_read``: what is skipped, what counts as acknowledged)."""
        ps = self.partitions.get(partition)
        if ps is not None and next_offset > ps.read_position:
            ps.take_read(messages, next_offset, self.settings.filter.tags, self.settings.filter.sql)
        return self._finish(now_ms)

    def skip_to(self, partition: int, position: int, now_ms: int) -> Effects:
        """The log no longer holds anything below ``position`` (retention): move past it."""
        ps = self.partitions.get(partition)
        if ps is not None and position > ps.read_position:
            ps.cursor.skip_to(position)
            ps.read_position = position
        return self._finish(now_ms)

    def next_deadline(self) -> int | None:
        return self.timers.next_due()

    def tick(self, now_ms: int) -> Effects:
        """Fire due timers: nack delays end, ack timeouts return what was never acknowledged."""
        for item in self.timers.pop_due(now_ms):
            if item[0] == "nack":
                _, p, o = item
                ps = self.partitions.get(p)  # type: ignore[call-overload]
                if ps is not None:
                    m = ps.delayed.pop(o, None)
                    if m is not None:
                        ps.add_replay(m)
            else:
                _, c, p, offsets, seq = item
                self._ack_timeout(c, p, offsets, seq, now_ms)  # type: ignore[arg-type]
        return self._finish(now_ms)

    def _ack_timeout(self, c: Consumer, partition: int, offsets: list[int], seq: int, now_ms: int) -> None:
        ps = self.partitions.get(partition)
        cinf = c.inflight.get(partition)
        if ps is None or cinf is None or c.state != ConsumerState.CONNECTED:
            return
        n = 0
        for o in offsets:
            if ps.inflight.get(o) is c and ps.delivery_seq.get(o) == seq:
                del ps.inflight[o]
                del ps.delivery_seq[o]
                m = cinf.pop(o)
                self._release_hash(c, m)
                self._return(ps, m, c, 0, now_ms, bump=True)
                n += 1
        if n:
            c.on_released(n)

    # ---- dispatch ------------------------------------------------------------------------------------

    def deliver(self, c: Consumer, ps: PartitionState, msgs: list[Message], now_ms: int) -> None:
        """Hand ``msgs`` (taken from ``ps``) to ``c``. Caller: ``selectors``."""
        cursor = ps.cursor
        offsets = list(map(offset_of, msgs))
        counts = cursor.counts_of(offsets) if cursor.has_counts else None
        limit = c.spec.max_redeliver
        if counts is not None and limit and max(counts) > limit:
            # Read again after a restart with a count already past the limit: DLQ, or held.
            msgs, counts = past_limit(self, ps, msgs, counts, limit, now_ms)
            if not msgs:
                return
            offsets = list(map(offset_of, msgs))
        p = ps.partition
        if self.parking.counts:
            counts = self.parking.counts_of(p, offsets, counts)  # stored heads: counted by parking
        self.partition_rr = p
        cinf = c.inflight.get(p)
        if cinf is None:
            cinf = c.inflight[p] = {}
        cinf.update(zip(offsets, msgs, strict=True))
        ps.inflight.update(zip(offsets, repeat(c)))
        d = self.fx.delivery(c.consumer_id)
        d.messages += msgs
        if counts is not None:
            d.counts += counts
        else:
            d.counts += [0] * len(msgs)
        cursor.note_delivered(max(offsets) + 1, len(msgs))  # not [-1]: redeliveries may come first
        c.on_sent(len(msgs))
        if self.settings.type == SubscriptionType.KEY_SHARED:
            holder, held = self.hash_holder, self.hash_held
            for m in msgs:
                h = m.key_hash
                holder[h] = c
                held[h] = held.get(h, 0) + 1
        if c.spec.ack_timeout_ms:
            seq = next(self._delivery_seq)
            for o in offsets:
                ps.delivery_seq[o] = seq
            self.timers.push(now_ms + c.spec.ack_timeout_ms, ("ack", c, p, offsets, seq))

    def _release_hash(self, c: Consumer, m: Message) -> None:
        if self.settings.type != SubscriptionType.KEY_SHARED:
            return
        h = m.key_hash
        if self.hash_holder.get(h) is c:
            n = self.hash_held[h] - 1
            if n:
                self.hash_held[h] = n
            else:
                del self.hash_held[h]
                del self.hash_holder[h]

    def _finish(self, now_ms: int) -> Effects:
        """Dispatch what can go now, then hand the accumulated effects over."""
        if self.parking.keys or self.parking.trackers:
            self.parking.settle(self, now_ms)
        if self.state == SubscriptionState.ACTIVE and self.consumers:
            selectors.dispatch(self, now_ms)
        if self.parking.events:
            self.fx.park_events, self.parking.events = self.parking.events, []
        fx, self.fx = self.fx, Effects()
        if self.settings.durable:
            fx.persist_soon = any(ps.cursor.urgent for ps in self.partitions.values())
        return fx

    # ---- introspection -------------------------------------------------------------------------------

    def unacked_total(self) -> int:
        return sum(len(ps.inflight) for ps in self.partitions.values())

    def give_back_memory(self) -> None:
        """Free the tables of empty in-flight dicts (``PartitionState.give_back``)."""
        for ps in self.partitions.values():
            ps.give_back(self.consumers.values())

    def held_messages(self) -> Iterator[Message]:
        """Every message sent and not acknowledged, or waiting for redelivery or the DLQ (what may stay
        in memory for long; ``messages.compact`` looks at these)."""
        for c in self.consumers.values():
            for msgs in c.inflight.values():
                yield from msgs.values()
        for ps in self.partitions.values():
            yield from ps.replay.values()
            yield from ps.delayed.values()
            yield from ps.dead.values()
        yield from self.parking.messages()
