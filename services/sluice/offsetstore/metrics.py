"""Prometheus metrics of the offset store, ``sluice_offset_store_*``.

Created once per process (the default registry refuses a name twice). The
committed-offset gauge has one series per (group, track, topic, partition) of
the clustering model: bounded by the cluster's partitions times its groups.
Broadcasting offsets are per member and are not exported as gauges.

``sluice_offset_store_last_commit_timestamp_seconds`` carries the ``member`` that last
committed a partition (one series per partition: the previous member's series is removed
when another member commits it), so dashboards can attribute the coordinator's per-partition
lag to members by joining on (group, track, topic, partition).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from threading import Lock

from prometheus_client import Counter, Gauge, Histogram

# Persisted cursor sizes: from an empty cursor (~30 bytes) to the 2 MB target.
CURSOR_BYTES_BUCKETS = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 2097152, 4194304)


@dataclass(frozen=True)
class OffsetStoreMetrics:
    commits: Counter
    committed_offset: Gauge
    resets: Counter
    cursor_saves: Counter
    cursor_bytes: Histogram
    cursor_bytes_written: Counter
    last_commit: Gauge
    # (group, track, topic, partition) -> the member whose series is exported now.
    _committers: dict[tuple[str, str, str, str], str] = field(default_factory=dict)
    _lock: Lock = field(default_factory=Lock)

    def committed(self, group: str, track: str, topic: str, partition: int, member: str, offset: int) -> None:
        """An accepted clustering commit: the offset gauge and the committing member's timestamp."""
        key = (group, track, topic, str(partition))
        self.committed_offset.labels(*key).set(offset)
        with self._lock:  # the default registry is read from the scrape thread
            previous = self._committers.get(key)
            if previous is not None and previous != member:
                self.last_commit.remove(*key, previous)
            self._committers[key] = member
        self.last_commit.labels(*key, member).set_to_current_time()


@cache
def offset_store_metrics() -> OffsetStoreMetrics:
    return OffsetStoreMetrics(
        commits=Counter(
            "sluice_offset_store_commits",
            "Partition offsets committed, by result code (NONE when accepted)",
            ["code"],
        ),
        committed_offset=Gauge(
            "sluice_offset_store_committed_offset",
            "Committed offset (next to consume) of a clustering group, per track and partition",
            ["group", "track", "topic", "partition"],
        ),
        resets=Counter(
            "sluice_offset_store_resets", "ResetOffsets calls, by result code (NONE when applied)", ["code"]
        ),
        cursor_saves=Counter(
            "sluice_offset_store_cursor_saves",
            "Cursors saved, by result code (NONE when written, FENCED_MEMBER_EPOCH when fenced)",
            ["code"],
        ),
        cursor_bytes=Histogram(
            "sluice_offset_store_cursor_bytes",
            "Persisted size of each saved cursor in bytes",
            buckets=CURSOR_BYTES_BUCKETS,
        ),
        cursor_bytes_written=Counter(
            "sluice_offset_store_cursor_bytes_written", "Bytes of encoded cursors written to Redis"
        ),
        last_commit=Gauge(
            "sluice_offset_store_last_commit_timestamp_seconds",
            "Unix time of the last accepted commit of a partition of a clustering group, by its member",
            ["group", "track", "topic", "partition", "member"],
        ),
    )
