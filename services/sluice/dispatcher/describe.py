"""What the dispatcher reports about its subscriptions: ``ListSubscriptions``, ``DescribeSubscription``
and the per-subscription gauges. Loaded subscriptions report their live state; idle durable ones (not
loaded, still registered: ``registry.py``) report their backlog from the book, with no consumers.
"""

from __future__ import annotations

import logging

from sluice.dispatcher.answers import ConsumerDescription, SubscriptionDescription, SubscriptionSummary
from sluice.dispatcher.host import ServiceHost
from sluice.dispatcher.metrics import GaugeRow
from sluice.dispatcher.registry import IdleSubscription, SubscriptionBook, wall_ms
from sluice.dispatcher.runtime import SubscriptionRuntime
from sluice.errors import SluiceError, UnknownSubscription
from sluice.security.context import Operation, RequestContext
from sluice.security.model import Resource, ResourceType

log = logging.getLogger(__name__)

__all__ = ["SubscriptionViews"]


class SubscriptionViews:
    def __init__(self, service: ServiceHost, book: SubscriptionBook) -> None:
        self._service = service
        self._book = book

    def backlog(self, rt: SubscriptionRuntime) -> int:
        total = 0
        for p, ps in rt.machine.partitions.items():
            feed = self._service.feeds.get((rt.topic, p))
            end = max(feed.high_watermark if feed is not None else -1, ps.read_position)
            total += max(end - ps.cursor.mark_delete - ps.cursor.acked.count(), 0)
        return total

    def summary(self, rt: SubscriptionRuntime) -> SubscriptionSummary:
        settings = rt.machine.settings
        return SubscriptionSummary(
            topic=rt.topic,
            subscription=rt.name,
            type=int(settings.type),
            consumers=len(rt.machine.consumers),
            backlog=self.backlog(rt),
            durable=rt.durable,
            last_active_ms=wall_ms() if rt.machine.consumers else rt.last_active_ms,
            loaded=True,
            filter=settings.filter.expression,
        )

    def idle_summary(self, entry: IdleSubscription) -> SubscriptionSummary:
        r = entry.record
        return SubscriptionSummary(
            topic=r.topic,
            subscription=r.subscription,
            type=r.type,
            consumers=0,
            backlog=self._book.backlog(entry),
            durable=True,
            last_active_ms=r.last_active_ms,
            loaded=False,
            filter=r.filter,
        )

    async def _refresh(self) -> None:
        """Bring the idle book up to date before answering an operator (metrics use it as it is)."""
        try:
            await self._book.refresh()
        except SluiceError as exc:  # answer from what is known; the loaded ones are exact anyway
            log.warning("listing idle subscriptions from the registry failed: %s", exc)

    def _all(self, topic: str) -> list[SubscriptionSummary]:
        service = self._service
        loaded = {k: rt for k, rt in list(service.runtimes.items()) if not rt.closing}
        rows = [self.summary(rt) for rt in loaded.values()]
        rows += [self.idle_summary(e) for k, e in list(self._book.idle.items()) if k not in loaded]
        return sorted(
            (r for r in rows if not topic or r.topic == topic), key=lambda r: (r.topic, r.subscription)
        )

    async def list_all(self, ctx: RequestContext, topic: str) -> list[SubscriptionSummary]:
        """Every subscription of ``topic`` (every one, for ``""``) this dispatcher serves that the
        caller may describe (a list is filtered, never refused: Kafka's ListGroups)."""
        await self._refresh()
        authorizer = self._service.authorizer
        return [
            row
            for row in self._all(topic)
            if authorizer.allowed(
                ctx, Operation.DESCRIBE, Resource(ResourceType.SUBSCRIPTION, row.subscription)
            )
            and authorizer.allowed(ctx, Operation.DESCRIBE, Resource(ResourceType.TOPIC, row.topic))
        ]

    async def describe(self, ctx: RequestContext, topic: str, subscription: str) -> SubscriptionDescription:
        service = self._service
        service.authorizer.authorize(
            ctx, Operation.DESCRIBE, Resource(ResourceType.SUBSCRIPTION, subscription)
        )
        service.authorizer.authorize(ctx, Operation.DESCRIBE, Resource(ResourceType.TOPIC, topic))
        rt = service.runtimes.get((topic, subscription))
        if rt is None or rt.closing:
            await self._refresh()
            entry = self._book.idle.get((topic, subscription))
            if entry is None:
                raise UnknownSubscription(
                    f"dispatcher {service.dispatcher_id!r} has no subscription {subscription!r} of topic "
                    f"{topic!r} (not registered as durable, no consumer connected, or another dispatcher "
                    "serves the topic)"
                )
            return SubscriptionDescription(self.idle_summary(entry))
        return SubscriptionDescription(
            summary=self.summary(rt),
            consumers=[
                ConsumerDescription(
                    consumer_id=c.consumer_id,
                    consumer_name=c.spec.name,
                    permits=c.permits,
                    unacked=c.unacked,
                    blocked=c.blocked,
                    active_partitions=sorted(c.active_partitions),
                )
                for c in sorted(rt.machine.consumers.values(), key=lambda c: c.join_seq)
            ],
        )

    def gauge_rows(self) -> list[GaugeRow]:
        """Called from the metrics thread: reads the state as it is, no I/O."""
        service = self._service
        rows = []
        loaded = dict(service.runtimes)
        for rt in loaded.values():
            consumers = list(rt.machine.consumers.values())
            parking = rt.machine.parking
            oldest = parking.oldest_ms()
            rows.append(
                GaugeRow(
                    rt.topic,
                    rt.name,
                    len(consumers),
                    sum(c.permits for c in consumers),
                    sum(c.unacked for c in consumers),
                    sum(1 for c in consumers if c.blocked),
                    self.backlog(rt),
                    sum(1 for ps in list(rt.machine.partitions.values()) if rt.durable and ps.cursor.dirty),
                    (wall_ms() if consumers else rt.last_active_ms) / 1000,
                    rt.machine.memory.used,
                    len(parking.keys),
                    parking.waiting_total,
                    0.0 if oldest is None else max(self._service.now_ms() - oldest, 0) / 1000,
                )
            )
        for key, entry in list(self._book.idle.items()):
            if key not in loaded:
                rows.append(
                    GaugeRow(
                        *key, 0, 0, 0, 0, self._book.backlog(entry), 0, entry.record.last_active_ms / 1000
                    )
                )
        return rows
