"""The scheduler's Prometheus metrics, ``sluice_scheduler_*`` (docs/metrics.md, "Scheduler").

Lateness is what an operator of delayed delivery cares about, so it is a histogram per delivered record
(the time its append was acknowledged minus its due time), with buckets around the 100 ms goal. A
histogram only moves while records are delivered, so a scheduler that stopped delivering shows up in
``overdue_seconds`` instead (how long the first due record has been waiting): the alerts use both.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "APPEND_BATCHES",
    "DELIVERED",
    "DUE",
    "ERRORS",
    "IN_MEMORY",
    "LATENESS",
    "OVERDUE",
    "PENDING",
    "READ",
]

#: Seconds: fine around the 100 ms goal, up to minutes for a scheduler that was down.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

PENDING = Gauge(
    "sluice_scheduler_pending_records",
    "Delayed records indexed and not yet delivered (counted from the bucket files at start, then kept up"
    " to date; records re-read after a crash count twice until their bucket is loaded)",
)
IN_MEMORY = Gauge(
    "sluice_scheduler_in_memory_records",
    "Pending records in memory (the buckets about to be due); the rest wait on disk",
)
OVERDUE = Gauge(
    "sluice_scheduler_overdue_seconds",
    "How long the first due record in memory has been due and not delivered (0 when none is due)",
)
READ = Counter(
    "sluice_scheduler_read_records",
    "Records read from the schedule topic and indexed into time buckets",
)
DUE = Counter(
    "sluice_scheduler_due_records",
    "Records that came due and were taken for delivery (again after a failed batch)",
)
DELIVERED = Counter(
    "sluice_scheduler_delivered_records",
    "Records appended to their topics (acknowledged by the brokers)",
)
APPEND_BATCHES = Histogram(
    "sluice_scheduler_append_batch_records",
    "Records per delivery batch (one flush of the delivery producers)",
    buckets=(1, 10, 100, 500, 1000, 2000, 5000),
)
LATENESS = Histogram(
    "sluice_scheduler_lateness_seconds",
    "Per delivered record: when its append was acknowledged minus its due time",
    buckets=LATENESS_BUCKETS,
)
ERRORS = Counter(
    "sluice_scheduler_errors",
    "Failures by stage: read (following the schedule topic), deliver (a batch whose outcome is unknown,"
    " then recovered), prepare (opening producers ahead), recover (scanning the marked partitions)",
    ["stage"],
)
for _stage in ("read", "deliver", "prepare", "recover"):
    ERRORS.labels(_stage)  # exported at 0 from the start, so rate() has a series before the first error
