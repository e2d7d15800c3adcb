"""Broker metrics, named ``sluice_broker_*`` (per-RPC metrics come from the shared interceptor).

- ``sluice_broker_bytes_in_total`` / ``records_in_total`` / ``bytes_out_total`` /
  ``records_out_total``, by topic. Record counts come from batch headers, never from decoding.
- ``sluice_broker_log_end_offset``, ``sluice_broker_log_start_offset``,
  ``sluice_broker_log_size_bytes``, by topic and partition: read from the served logs at
  scrape time by a collector, so appends pay nothing for them.
- ``sluice_broker_produce_flush_seconds``: how long an acknowledged produce waited for its
  fsync (flush=always); ``sluice_broker_fsync_seconds``: one fsync round;
  ``sluice_broker_group_commit_waiters``: produce requests released per round.
- ``sluice_broker_fetch_parked``: fetch requests parked in long-poll now;
  ``sluice_broker_fetch_sessions``: open incremental fetch sessions.
- ``sluice_broker_segment_handles_open`` / ``_capacity``, ``sluice_broker_segment_handle_opens_total``
  / ``_hits_total`` / ``_evictions_total``: the LRU of read descriptors on sealed segments
  (docs/storage.md, "Descriptor budget"); ``sluice_broker_partition_budget``: partition logs
  the soft open-files limit leaves room for.
- ``sluice_broker_disk_free_bytes`` / ``_total_bytes`` / ``_min_free_bytes`` by ``log_dir`` and
  ``sluice_broker_disk_full_refusals_total``: the data directory's space (``statvfs`` at scrape) and the
  appends refused under the minimum (docs/storage.md, "Disk full"); the chart alerts on free < 2 x min.
- ``sluice_broker_wire_connections``: open wire-protocol connections (``sluice.server.wire``).

Metric objects are process-wide (the default registry), created once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from threading import Lock

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.log.partition_log import PartitionLog
from sluice.broker.log.space import DiskStats
from sluice.codec.batch.layout import iter_spans, record_count_at

FLUSH_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
WAITER_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 1024)


class LogStats:
    """What the collector reads per partition: (log_start, log_end, size_bytes)."""

    __slots__ = ("source",)

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[tuple[TopicPartitionKey, int, int, int]]] | None = None


class _LogCollector(Collector):
    def __init__(self, stats: LogStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        end = GaugeMetricFamily(
            "sluice_broker_log_end_offset",
            "Log end offset (high watermark) per partition",
            labels=["topic", "partition"],
        )
        start = GaugeMetricFamily(
            "sluice_broker_log_start_offset", "First offset still in the log", labels=["topic", "partition"]
        )
        size = GaugeMetricFamily(
            "sluice_broker_log_size_bytes",
            "Bytes of log on disk per partition",
            labels=["topic", "partition"],
        )
        source = self._stats.source
        if source is not None:
            for (topic, partition), log_start, log_end, size_bytes in source():
                labels = [topic, str(partition)]
                end.add_metric(labels, log_end)
                start.add_metric(labels, log_start)
                size.add_metric(labels, size_bytes)
        yield end
        yield start
        yield size


class HandleStats:
    """What the descriptor collector reads: a callable giving (open, capacity, opens, hits,
    evictions, partition budget)."""

    __slots__ = ("source",)

    def __init__(self) -> None:
        self.source: Callable[[], tuple[int, int, int, int, int, int]] | None = None


class _HandleCollector(Collector):
    def __init__(self, stats: HandleStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        source = self._stats.source
        if source is None:
            return
        open_now, capacity, opens, hits, evictions, budget = source()
        prefix = "sluice_broker_segment_handle"
        yield GaugeMetricFamily(prefix + "s_open", "Sealed-segment read descriptors open now", value=open_now)
        yield GaugeMetricFamily(prefix + "s_capacity", "Size of the sealed-segment read LRU", value=capacity)
        yield CounterMetricFamily(prefix + "_opens", "Sealed-segment files opened for reading", value=opens)
        yield CounterMetricFamily(
            prefix + "_hits", "Sealed-segment reads served by an open descriptor", value=hits
        )
        yield CounterMetricFamily(
            prefix + "_evictions", "Read descriptors closed to stay in the LRU", value=evictions
        )
        yield GaugeMetricFamily(
            "sluice_broker_partition_budget",
            "Partition logs the soft open-files limit leaves room for",
            value=budget,
        )


def log_stats(
    served: Mapping[TopicPartitionKey, PartitionLog],
) -> list[tuple[TopicPartitionKey, int, int, int]]:
    """Per served partition (start, end, size): the LogStats source, read from the metrics thread."""
    out = []
    for key, plog in list(served.items()):
        try:
            out.append((key, plog.log_start_offset, plog.log_end_offset, plog.size_bytes))
        except Exception:
            continue
    return out


def producer_stats(served: Mapping[TopicPartitionKey, PartitionLog]) -> tuple[int, int]:
    """(entries, evictions) of the served partitions' producer tables, read from the metrics thread."""
    tables = [plog.producers.table for plog in list(served.values())]
    return sum(len(t) for t in tables), sum(t.evictions for t in tables)


class ProducerStats:
    """What the producer-state collector reads: a callable giving (entries, evictions) summed over the
    served partitions (idempotent producers, docs/replication.md)."""

    __slots__ = ("source",)

    def __init__(self) -> None:
        self.source: Callable[[], tuple[int, int]] | None = None


class _ProducerCollector(Collector):
    def __init__(self, stats: ProducerStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        entries, evictions = self._stats.source() if self._stats.source is not None else (0, 0)
        yield GaugeMetricFamily(
            "sluice_broker_producer_ids",
            "Idempotent producer entries held, summed over the partitions (bounded per partition)",
            value=entries,
        )
        yield CounterMetricFamily(
            "sluice_broker_producer_id_evictions",
            "Producer entries evicted to stay within the per-partition cap (their producers restart)",
            value=evictions,
        )


class DiskStatsSource:
    """What the disk collector reads: a callable giving each log directory's ``DiskStats``."""

    __slots__ = ("source",)

    def __init__(self) -> None:
        self.source: Callable[[], Iterable[DiskStats]] | None = None


class _DiskCollector(Collector):
    def __init__(self, stats: DiskStatsSource) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        labels = ["log_dir"]
        free = GaugeMetricFamily(
            "sluice_broker_disk_free_bytes", "Free bytes of the log directory's filesystem", labels=labels
        )
        total = GaugeMetricFamily(
            "sluice_broker_disk_total_bytes", "Size of the log directory's filesystem", labels=labels
        )
        minimum = GaugeMetricFamily(
            "sluice_broker_disk_min_free_bytes",
            "Free bytes below which produce is refused with STORAGE_FULL",
            labels=labels,
        )
        refused = CounterMetricFamily(
            "sluice_broker_disk_full_refusals",
            "Appends refused because the log directory was below its minimum of free bytes",
            labels=labels,
        )
        source = self._stats.source
        for d in source() if source is not None else ():
            free.add_metric([d.log_dir], d.free_bytes)
            total.add_metric([d.log_dir], d.total_bytes)
            minimum.add_metric([d.log_dir], d.min_free_bytes)
            refused.add_metric([d.log_dir], d.refusals)
        yield from (free, total, minimum, refused)


class BrokerMetrics:
    """The broker's metric objects, with per-topic children cached (labels() is not free)."""

    def __init__(self) -> None:
        self.bytes_in = Counter("sluice_broker_bytes_in", "Record batch bytes appended, by topic", ["topic"])
        self.records_in = Counter("sluice_broker_records_in", "Records appended, by topic", ["topic"])
        self.bytes_out = Counter("sluice_broker_bytes_out", "Record batch bytes fetched, by topic", ["topic"])
        self.records_out = Counter("sluice_broker_records_out", "Records fetched, by topic", ["topic"])
        self.produce_flush = Histogram(
            "sluice_broker_produce_flush_seconds",
            "Time an acknowledged produce waited for its fsync (flush=always)",
            buckets=FLUSH_BUCKETS,
        )
        self.fsync = Histogram(
            "sluice_broker_fsync_seconds", "Duration of one fsync round", buckets=FLUSH_BUCKETS
        )
        self.group_commit_waiters = Histogram(
            "sluice_broker_group_commit_waiters",
            "Produce requests released by one fsync round",
            buckets=WAITER_BUCKETS,
        )
        self.fetch_parked = Gauge("sluice_broker_fetch_parked", "Fetch requests parked in long-poll")
        self.fetch_sessions = Gauge("sluice_broker_fetch_sessions", "Open incremental fetch sessions")
        self.isr_shrinks = Counter(
            "sluice_broker_isr_shrinks", "Replicas that left the in-sync set of a partition this broker leads"
        )
        self.isr_expands = Counter(
            "sluice_broker_isr_expands",
            "In-sync set expansions this broker's partitions had, as their leader",
        )
        self.under_replicated = Gauge(
            "sluice_broker_under_replicated_partitions",
            "Partitions this broker leads whose in-sync set is smaller than their replicas",
        )
        self.follower_lag = Gauge(
            "sluice_broker_follower_lag_records",
            "The largest lag (leader log end minus follower log end, in offsets) of a follower of a "
            "partition this broker leads",
        )
        self.scrub_bytes = Counter(
            "sluice_broker_scrub_bytes", "Sealed-segment bytes the background scrub re-verified"
        )
        self.scrub_damaged = Counter(
            "sluice_broker_scrub_damaged_batches",
            "Batches the background scrub found failing their CRC (reported to the controller as damaged)",
        )
        self.log_stats = LogStats()
        REGISTRY.register(_LogCollector(self.log_stats))
        self.handle_stats = HandleStats()
        REGISTRY.register(_HandleCollector(self.handle_stats))
        self.producer_stats = ProducerStats()
        REGISTRY.register(_ProducerCollector(self.producer_stats))
        self.disk_stats = DiskStatsSource()
        REGISTRY.register(_DiskCollector(self.disk_stats))
        self._in: dict[str, tuple[Counter, Counter]] = {}
        self._out: dict[str, tuple[Counter, Counter]] = {}

    def appended(self, topic: str, nbytes: int, records: int) -> None:
        children = self._in.get(topic)
        if children is None:
            children = self._in[topic] = (self.bytes_in.labels(topic), self.records_in.labels(topic))
        children[0].inc(nbytes)
        children[1].inc(records)

    def fetched(self, topic: str, chunks: Iterable[bytes]) -> None:
        """Count a partition's fetched batches (from their headers only)."""
        children = self._out.get(topic)
        if children is None:
            children = self._out[topic] = (self.bytes_out.labels(topic), self.records_out.labels(topic))
        nbytes = records = 0
        for chunk in chunks:
            nbytes += len(chunk)
            records += sum(record_count_at(chunk, pos) for pos, _, _ in iter_spans(chunk))
        children[0].inc(nbytes)
        children[1].inc(records)

    def fsync_round(self, seconds: float, waiters: int) -> None:
        self.fsync.observe(seconds)
        if waiters:
            self.group_commit_waiters.observe(waiters)


_metrics: BrokerMetrics | None = None
_lock = Lock()


def broker_metrics() -> BrokerMetrics:
    """The process-wide broker metrics (created on first use)."""
    global _metrics
    with _lock:
        if _metrics is None:
            _metrics = BrokerMetrics()
        return _metrics
