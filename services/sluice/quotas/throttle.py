"""Kafka's throttle model (KIP-219) over a per-key rate meter: how long a caller must wait.

Each metered key (an entity a quota governs) and resource has a token bucket (``common/rate.py``)
holding ``burst_s`` seconds of its rate; every amount recorded is spent from it, into debt if need
be. A caller whose bucket is in debt is over its quota by exactly ``debt / rate`` seconds: that is
its throttle time. Kafka reaches the same figure from sampled
windows (``(observed - quota) / quota * window``); the meter gives it exactly, in O(1) per request,
whatever the request sizes.

The throttle is enforced here, not trusted to the client: the caller's requests (of the metered
resources) are held until ``now + throttle`` (``hold_s``): a wire connection stops reading
(``gate``), a gRPC stream stops pulling messages. The answer that caused it is sent at once, not an
error, carrying ``throttle_time_ms`` so a well-behaved client waits instead of queueing at the broker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from prometheus_client import Counter, Histogram

from sluice.common.rate import TokenBucket
from sluice.quotas.model import Limits, QuotaKey, QuotaSnapshot, Resource, key_of
from sluice.security.context import RequestContext

__all__ = [
    "BURST_S",
    "FETCH",
    "MAX_THROTTLE_S",
    "PRODUCE",
    "SUBSCRIBE",
    "QuotaManager",
    "admit",
    "quotas_hold",
    "throttle_ms",
]

#: How far ahead of its rate a caller may run before it is throttled: two seconds of its quota, so a
#: caller under its quota is never delayed, a burst after idling is not punished, and a caller that
#: was held up (a stalled machine: measured, a 2.6 s gap on a loaded 2-core host) catches up what it
#: lost, as Kafka's 11 one-second sample windows let it.
BURST_S = 2.0
#: The longest one throttle lasts (and the most debt a meter keeps): one huge request does not shut
#: its caller out for hours, and a quota raised later takes effect within this.
MAX_THROTTLE_S = 30.0
#: Meters kept before idle ones (full: equal to a fresh one) are dropped.
PRUNE_AT = 10_000

#: The resources a produce, a fetch and a subscribe are metered (and held) by.
PRODUCE = (Resource.PRODUCE_BYTES, Resource.REQUESTS)
FETCH = (Resource.FETCH_BYTES, Resource.REQUESTS)
SUBSCRIBE = (Resource.SUBSCRIBES,)

# The entity label is the quota entry that governs the caller ("user:alice", "client:<default>"):
# bounded by the quotas configured, never by the number of callers.
THROTTLE_SECONDS = Counter(
    "sluice_quota_throttle_seconds",
    "Throttle time given to callers over a quota, by resource and the quota entry that governs them",
    ["resource", "entity"],
)
METERED = Counter(
    "sluice_quota_metered",
    "Amounts counted against quotas (bytes, requests, subscribes), by resource and quota entry",
    ["resource", "entity"],
)
HELD = Counter(
    "sluice_quota_held_requests",
    "Requests (and followed fetch rounds) a throttled caller sent before its throttle time was over, "
    "held by the service until it was: a client that honours throttle_time_ms causes none",
)
THROTTLE_TIME = Histogram(
    "sluice_quota_throttle_time_seconds",
    "Throttle time of each throttled request, by resource",
    ["resource"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)


class QuotaManager:
    """A service's quotas and meters. Use from one event loop (no locks: every call is synchronous)."""

    def __init__(
        self,
        snapshot: QuotaSnapshot | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        burst_s: float = BURST_S,
    ) -> None:
        self.snapshot = snapshot or QuotaSnapshot()
        self._clock = clock
        self._burst_s = burst_s
        #: (governed key, resource) -> its meter.
        self._buckets: dict[tuple[QuotaKey, Resource], TokenBucket] = {}

    @property
    def enabled(self) -> bool:
        return len(self.snapshot) > 0

    def replace(self, snapshot: QuotaSnapshot) -> None:
        """Decide from ``snapshot`` from now on. Meters are kept: a changed rate applies to the debt
        already run up (at most MAX_THROTTLE_S of it)."""
        self.snapshot = snapshot
        if not snapshot.quotas:
            self._buckets.clear()

    def hold_s(self, ctx: RequestContext, resources: Iterable[Resource], client_id: str = "") -> float:
        """How long the caller's next request of ``resources`` must wait (0: serve it now).
        ``client_id``: what a request names (``FetchRequest.client_id``), used when the connection
        or call announced none, so a followed fetch's rounds count as its first answer did."""
        if not self.snapshot.quotas:
            return 0.0
        key = key_of(ctx.principal, ctx.client_id or client_id)
        found = self.snapshot.limits(key)
        if found is None:  # no quota (any more): whatever debt its meters hold is forgiven
            return 0.0
        now = self._clock()
        hold = 0.0
        for resource in resources:
            bucket = self._buckets.get((key, resource))
            if bucket is not None and found[1].rate(resource) > 0:
                hold = max(hold, bucket.wait_s(now, need=0.0))
        return min(hold, MAX_THROTTLE_S)

    def record(
        self, ctx: RequestContext, amounts: Iterable[tuple[Resource, float]], client_id: str = ""
    ) -> float:
        """Count ``amounts`` against the caller's quotas; returns its throttle time in seconds."""
        if not self.snapshot.quotas:
            return 0.0
        found = self.snapshot.limits(key_of(ctx.principal, ctx.client_id or client_id))
        if found is None:
            return 0.0
        governing, limits = found
        # A default quota meters each caller on its own: the caller's key, not the default's.
        key = key_of(ctx.principal, ctx.client_id or client_id)
        now = self._clock()
        throttle = 0.0
        for resource, amount in amounts:
            throttle = max(throttle, self._meter(key, governing, limits, resource, amount, now))
        return throttle

    def _meter(
        self,
        key: QuotaKey,
        governing: QuotaKey,
        limits: Limits,
        resource: Resource,
        amount: float,
        now: float,
    ) -> float:
        rate = limits.rate(resource)
        if rate <= 0 or amount <= 0:
            return 0.0
        entity = str(governing)
        METERED.labels(resource.value, entity).inc(amount)
        slot = (key, resource)
        bucket = self._buckets.get(slot)
        if bucket is None:
            if len(self._buckets) >= PRUNE_AT:
                self._prune(now)
            bucket = self._buckets[slot] = TokenBucket(rate, rate * self._burst_s, now)
        elif bucket.rate != rate:
            bucket.retune(rate, rate * self._burst_s, now)
        # Debt beyond the longest throttle is forgiven (see MAX_THROTTLE_S).
        left = bucket.spend(amount, now, floor=-rate * MAX_THROTTLE_S)
        throttle = max(0.0, -left / rate)
        if throttle > 0:
            THROTTLE_SECONDS.labels(resource.value, entity).inc(throttle)
            THROTTLE_TIME.labels(resource.value).observe(throttle)
        return throttle

    def _prune(self, now: float) -> None:
        self._buckets = {slot: b for slot, b in self._buckets.items() if not b.is_full(now)}


async def quotas_hold(
    quotas: QuotaManager, ctx: RequestContext, resources: Iterable[Resource], client_id: str = ""
) -> None:
    """Wait out the caller's throttle, if any (a gRPC handler: its stream is not read meanwhile)."""
    hold = quotas.hold_s(ctx, resources, client_id)
    if hold > 0:
        HELD.inc()
        await asyncio.sleep(hold)


async def admit(quotas: QuotaManager, ctx: RequestContext, resource: Resource, amount: float = 1.0) -> None:
    """Wait until the caller may do one more of ``resource``, then count it (a dispatcher's
    Subscribe: Pulsar's ``subscribeRatePerConsumer``, enforced by delaying the call). The check and
    the count happen in one step of the event loop, so concurrent calls cannot all slip through."""
    # Bounded: each round waits out a hold that concurrent calls of the same caller set meanwhile.
    for _ in range(100):
        hold = quotas.hold_s(ctx, (resource,))
        if hold <= 0:
            break
        HELD.inc()
        await asyncio.sleep(hold)
    quotas.record(ctx, ((resource, amount),))


def throttle_ms(seconds: float) -> int:
    """A throttle time as the answers carry it (whole milliseconds, rounded up: never too short)."""
    return 0 if seconds <= 0 else int(seconds * 1000) + 1
