"""A TestContext for the pure subscription state machine: a fake clock and a fake log.

``ctx.produce(...)`` appends records to partitions and offers them to the subscription (as the
partition feed would); ``ctx.advance(ms)`` moves the clock and fires due timers; every effect is
recorded per consumer in ``ctx.received`` / ``ctx.active`` / ``ctx.dead``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from sluice.codec.batch import BatchBuilder, batch_views, stamp
from sluice.codec.filter import parse_filter
from sluice.dispatcher.consumer import Consumer, ConsumerSpec
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.messages import Message, messages_of
from sluice.dispatcher.model import Effects, SubscriptionSettings, SubscriptionType
from sluice.dispatcher.subscription import Subscription

Got = tuple[int, int, int]  # (partition, offset, redelivery_count)


class Ctx:
    def __init__(
        self,
        kind: SubscriptionType = SubscriptionType.SHARED,
        partitions: Iterable[int] = (0,),
        sticky: bool = False,
        filter: str = "*",
        read_ahead_bytes: int = 1 << 30,
        cursors: dict[int, PartitionCursor] | None = None,
    ) -> None:
        self.now = 0
        self.settings = SubscriptionSettings(
            type=kind, sticky=sticky, filter=parse_filter(filter), read_ahead_bytes=read_ahead_bytes
        )
        self.sub = Subscription("t", "s", self.settings)
        self.next_offset: dict[int, int] = {}
        for p in partitions:
            cur = (cursors or {}).get(p) or PartitionCursor(p)
            self.sub.attach_partition(cur, cur.mark_delete)
            self.next_offset[p] = cur.mark_delete
        self.consumers: dict[str, Consumer] = {}
        self.received: dict[str, list[Got]] = defaultdict(list)
        self.messages: dict[str, list[Message]] = defaultdict(list)
        self.active: dict[str, dict[int, bool]] = defaultdict(dict)
        self.active_log: list[tuple[str, int, bool]] = []
        self.dead: list[tuple[int, int, int]] = []
        self.auto_dlq = True
        #: The parking store's events, in order (``parkstore.py`` writes them); acknowledged at once
        #: unless ``auto_park`` is False (then ``save_parks`` does).
        self.park_log: list[Any] = []
        self.park_unsaved: list[Any] = []
        self.auto_park = True
        self.apply(self.sub.activate(self.now))

    # ---- effects -------------------------------------------------------------------------------------

    def apply(self, fx: Effects) -> Effects:
        for cid, d in fx.deliveries.items():
            for m, n in zip(d.messages, d.counts, strict=True):
                self.received[cid].append((m.partition, m.offset, n))
                self.messages[cid].append(m)
        for cid, p, on in fx.active_changes:
            self.active[cid][p] = on
            self.active_log.append((cid, p, on))
        for m, n in fx.dead_letters:
            self.dead.append((m.partition, m.offset, n))
        if fx.park_events:
            self.park_log += fx.park_events
            self.park_unsaved += fx.park_events
            if self.auto_park:
                self.save_parks()
        if fx.dead_letters and self.auto_dlq:
            by_part: dict[int, list[int]] = defaultdict(list)
            for m, _ in fx.dead_letters:
                by_part[m.partition].append(m.offset)
            for p, offs in by_part.items():
                self.apply(self.sub.dead_lettered(p, offs, self.now))
        return fx

    def save_parks(self) -> None:
        """The parking store acknowledged every event so far."""
        saved: dict[int, list[int]] = defaultdict(list)
        for e in self.park_unsaved:
            if e.op == "park":
                saved[e.partition].append(e.offset)
        self.park_unsaved = []
        if saved:
            self.apply(self.sub.parks_saved(dict(saved), self.now))

    # ---- driving -------------------------------------------------------------------------------------

    def produce(
        self,
        partition: int = 0,
        n: int = 1,
        keys: Iterable[bytes | None] | None = None,
        tags: Iterable[str | None] | None = None,
        epoch: int = 0,
    ) -> list[int]:
        start = self.next_offset[partition]
        key_list = list(keys) if keys is not None else [None] * n
        tag_list = list(tags) if tags is not None else [None] * len(key_list)
        # One log batch, stamped as the broker would, read the way the partition feed reads it.
        builder = BatchBuilder()
        for i, (k, t) in enumerate(zip(key_list, tag_list, strict=True)):
            builder.append(f"v{start + i}".encode(), k, t, None, 1000 + i)
        raw = bytearray(builder.build())
        stamp(raw, 0, start, 1, epoch)
        msgs = messages_of(batch_views(bytes(raw)), partition, start)
        self.next_offset[partition] = start + len(msgs)
        self.apply(self.sub.offer(partition, msgs, start + len(msgs), self.now))
        return [m.offset for m in msgs]

    def join(self, cid: str, permits: int = 0, **spec: Any) -> Consumer:
        s = ConsumerSpec(consumer_id=cid, name=str(spec.pop("name", cid)), **spec)
        c, fx = self.sub.add_consumer(s, self.settings_for(s), self.now)
        self.consumers[cid] = c
        self.apply(fx)
        if permits:
            self.flow(cid, permits)
        return c

    def settings_for(self, spec: ConsumerSpec) -> SubscriptionSettings:
        return self.settings

    def leave(self, cid: str) -> None:
        self.apply(self.sub.remove_consumer(self.consumers[cid], self.now))

    def flow(self, cid: str, permits: int) -> None:
        self.apply(self.sub.flow(self.consumers[cid], permits, self.now))

    def ack(
        self, cid: str, ids: Iterable[tuple[int, int]], cumulative: bool = False
    ) -> list[tuple[int, int]]:
        by: dict[int, list[int]] = defaultdict(list)
        for p, o in ids:
            by[p].append(o)
        fx, bad = self.sub.ack(self.consumers[cid], dict(by), cumulative, self.now)
        self.apply(fx)
        return bad

    def ack_all(self, cid: str) -> None:
        """Acknowledge everything the consumer currently holds."""
        c = self.consumers[cid]
        ids = [(p, o) for p, msgs in c.inflight.items() for o in msgs]
        assert not self.ack(cid, ids)

    def nack(self, cid: str, ids: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
        by: dict[int, list[int]] = defaultdict(list)
        for p, o in ids:
            by[p].append(o)
        fx, bad = self.sub.nack(self.consumers[cid], dict(by), self.now)
        self.apply(fx)
        return bad

    def advance(self, ms: int) -> None:
        self.now += ms
        self.apply(self.sub.tick(self.now))

    def offsets(self, cid: str) -> list[int]:
        return [o for _, o, _ in self.received[cid]]

    def take(self, cid: str) -> list[Got]:
        """What the consumer received since the last take."""
        got = self.received[cid]
        self.received[cid] = []
        self.messages[cid] = []
        return got
