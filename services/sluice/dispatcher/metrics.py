"""``sluice_dispatcher_*`` metrics, by topic and subscription.

Counters are incremented once per batch (never per message). Gauges (consumers, permits, unacked,
blocked consumers, backlog, dirty cursors, last active time) are computed from the live state when
Prometheus scrapes, by a collector, so the hot path does not maintain them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from threading import Lock

from prometheus_client import REGISTRY, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.dispatcher.budget import MemoryBudget

__all__ = ["DispatcherMetrics", "GaugeRow", "dispatcher_metrics"]

P = "sluice_dispatcher"


@dataclass(frozen=True, slots=True)
class GaugeRow:
    topic: str
    subscription: str
    consumers: int
    permits: int
    unacked: int
    blocked: int
    backlog: int
    dirty_cursors: int
    #: Unix time: now while consumers are connected, else when the last one left (0: unknown).
    last_active: float = 0.0
    #: Bytes it holds against the memory budget (``budget.py``).
    memory: int = 0
    #: Key_Shared poison isolation (``parking.py``): parked keys, their waiting messages, and the age
    #: in seconds of the oldest parking (0: none).
    parked_keys: int = 0
    parked_messages: int = 0
    parked_age: float = 0.0


class _StateCollector(Collector):
    def __init__(self) -> None:
        self.source: Callable[[], list[GaugeRow]] | None = None
        #: The dispatcher's memory budget (``budget.py``): read at scrape time, like the rows.
        self.budget: MemoryBudget | None = None

    def collect(self) -> Iterator[Metric]:
        rows: list[GaugeRow] = []
        if self.source is not None:
            for _ in range(3):  # the event loop may change the state while this thread reads it
                try:
                    rows = self.source()
                    break
                except RuntimeError:
                    continue
        labels = ["topic", "subscription"]
        fams = {
            "consumers": GaugeMetricFamily(f"{P}_consumers", "Connected consumers", labels=labels),
            "permits": GaugeMetricFamily(f"{P}_permits", "Permits granted and not used yet", labels=labels),
            "unacked": GaugeMetricFamily(f"{P}_unacked", "Messages sent and not acknowledged", labels=labels),
            "blocked": GaugeMetricFamily(
                f"{P}_blocked_consumers", "Consumers blocked at max_unacked", labels=labels
            ),
            "backlog": GaugeMetricFamily(f"{P}_backlog", "Messages not acknowledged yet", labels=labels),
            "dirty_cursors": GaugeMetricFamily(
                f"{P}_cursors_dirty",
                "Durable cursors with changes not yet in the offset store",
                labels=labels,
            ),
            "last_active": GaugeMetricFamily(
                f"{P}_subscription_last_active_seconds",
                "Unix time the subscription last had a consumer (now while it has one)",
                labels=labels,
            ),
            "memory": GaugeMetricFamily(
                f"{P}_subscription_memory_bytes",
                "Bytes the subscription holds against the memory budget (read ahead, unacked, to redeliver)",
                labels=labels,
            ),
            "parked_keys": GaugeMetricFamily(
                f"{P}_parked_keys", "Key_Shared keys parked after repeated failures", labels=labels
            ),
            "parked_messages": GaugeMetricFamily(
                f"{P}_parked_messages",
                "Messages of parked keys held back (held heads included)",
                labels=labels,
            ),
            "parked_age": GaugeMetricFamily(
                f"{P}_parked_oldest_age_seconds",
                "Age of the subscription's oldest parked key (0: none parked)",
                labels=labels,
            ),
        }
        for r in rows:
            for name, fam in fams.items():
                fam.add_metric([r.topic, r.subscription], getattr(r, name))
        yield from fams.values()
        yield from self._budget()

    def _budget(self) -> Iterator[Metric]:
        b = self.budget
        if b is None:
            return
        yield GaugeMetricFamily(
            f"{P}_memory_budget_used_bytes", "Bytes all subscriptions hold against the budget", value=b.used
        )
        yield GaugeMetricFamily(
            f"{P}_memory_budget_limit_bytes", "The memory budget (0: no limit)", value=b.limit
        )
        yield GaugeMetricFamily(
            f"{P}_memory_budget_paused_subscriptions",
            "Subscriptions not reading from brokers because of the memory budget",
            value=len(b.paused),
        )
        yield CounterMetricFamily(
            f"{P}_memory_budget_read_pauses",
            "Times a subscription stopped reading from brokers because of the memory budget",
            value=b.paused_total,
        )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


@dataclass(frozen=True)
class DispatcherMetrics:
    dispatched_messages: Counter
    dispatched_bytes: Counter
    acks: Counter
    redeliveries: Counter
    dlq: Counter
    cursor_flushes: Counter
    #: Flushes asked for by a delivery waiting at its cursor's gate (crash counts), not by the interval.
    cursor_flushes_early: Counter
    #: Positions moved back because the partition's log was truncated under them (KIP-320).
    log_truncations: Counter
    #: Acks and nacks refused because their record was truncated away (``ack_epochs.py``).
    epoch_refused: Counter
    state: _StateCollector


_cache: DispatcherMetrics | None = None
_lock = Lock()


def dispatcher_metrics() -> DispatcherMetrics:
    global _cache
    with _lock:
        if _cache is None:
            labels = ["topic", "subscription"]
            state = _StateCollector()
            REGISTRY.register(state)
            _cache = DispatcherMetrics(
                dispatched_messages=Counter(f"{P}_dispatched_messages", "Messages sent to consumers", labels),
                dispatched_bytes=Counter(f"{P}_dispatched_bytes", "Encoded bytes sent to consumers", labels),
                acks=Counter(f"{P}_acked_messages", "Messages acknowledged by consumers", labels),
                redeliveries=Counter(
                    f"{P}_redeliveries",
                    "Messages that went back unacknowledged (nack, timeout, disconnect)",
                    labels,
                ),
                dlq=Counter(f"{P}_dlq_messages", "Messages published to a dead-letter topic", labels),
                cursor_flushes=Counter(f"{P}_cursor_flushes", "SaveCursors batches written", ["result"]),
                cursor_flushes_early=Counter(
                    f"{P}_cursor_flushes_early",
                    "Cursor flushes run before the interval because a delivery waited for one",
                ),
                log_truncations=Counter(
                    f"{P}_log_truncations",
                    "Subscription positions moved back because an unclean leader election truncated "
                    "records the dispatcher had read (found by a feed, or when loading a cursor)",
                    [*labels, "found_by"],
                ),
                epoch_refused=Counter(
                    f"{P}_epoch_refused_acks",
                    "Acked or nacked message ids refused because they name a leader epoch other than the "
                    "record now at their offset (the record acked was truncated by an unclean election)",
                    [*labels, "kind"],
                ),
                state=state,
            )
        return _cache
