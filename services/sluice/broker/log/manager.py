"""Every partition log of one broker, one directory each under the data directory.

Layout: ``<data_dir>/<topic>-<partition>/`` holds the partition's segments and a small
``partition.json`` naming the topic, partition, ``topic_id`` and any per-topic config.
The topic id tells a re-created topic from a deleted one of the same name: data whose id
differs belongs to the dead topic and is removed.

A directory being deleted is first renamed to ``~deleted-...`` (``~`` cannot appear in a
topic name), so a crash mid-delete never resurrects half a partition; ``open_all`` finishes
the job.

Descriptors: every open log holds one (its active segment); sealed segments share the
``ReadHandles`` LRU. ``create`` refuses a partition, with a retriable StorageError, when
``partitions + LRU capacity + reserve`` would pass the soft open-files limit: the reserve
keeps descriptors for connections, so a broker with too many partitions says so at
CreateTopic rather than later failing to accept clients (docs/storage.md).

Caller: the broker service, from its event loop (``flush_all`` may run on a worker thread, and so does
``create`` for the logs an update creates, one update at a time, while the loop only reads the table).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.broker.log.config import LogConfig
from sluice.broker.log.durable import fsync_dir
from sluice.broker.log.handles import DEFAULT_READ_HANDLES, ReadHandles, storage_error
from sluice.broker.log.partition_log import PartitionLog, wall_clock_ms
from sluice.broker.log.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_stem
from sluice.broker.log.space import DiskSpace
from sluice.common.names import validate_topic
from sluice.errors import InvalidArgument, InvalidPartitions, SluiceError, StorageError
from sluice.server.limits import open_files_soft_limit

log = logging.getLogger(__name__)

META_FILE = "partition.json"
#: Written by ``close()`` once every log is flushed and closed; removed at open. Without it the
#: last shutdown was unclean (a crash, kill -9, power loss) and every batch is verified at open.
CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
META_VERSION = 1
DELETED_PREFIX = "~deleted-"
#: Descriptors kept free of partition logs by default: connections, the listeners, gRPC's
#: own (epoll, wakeup pipes), flush dups, metadata writes.
DEFAULT_DESCRIPTOR_RESERVE = 256

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class PartitionMeta:
    topic: str
    partition: int
    topic_id: str
    #: None: the manager's default config applies.
    config: LogConfig | None

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": META_VERSION,
                "topic": self.topic,
                "partition": self.partition,
                "topic_id": self.topic_id,
                "config": None if self.config is None else self.config.to_dict(),
            },
            indent=1,
        )

    @classmethod
    def read(cls, directory: Path) -> PartitionMeta | None:
        """The metadata of a partition directory; None if absent or unreadable."""
        try:
            raw: Any = json.loads((directory / META_FILE).read_text())
            config = raw.get("config")
            return cls(
                topic=validate_topic(raw["topic"]),
                partition=int(raw["partition"]),
                topic_id=str(raw["topic_id"]),
                config=None if config is None else LogConfig.from_dict(config),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, SluiceError) as exc:
            log.warning("unreadable partition metadata in %s: %s", directory, exc)
            return None

    def write(self, directory: Path) -> None:
        """Atomically replace the metadata file (write, fsync, rename, fsync the directory)."""
        tmp = directory / (META_FILE + ".tmp")
        with open(tmp, "w") as f:
            f.write(self.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / META_FILE)
        fsync_dir(directory)


def _discard_new_dir(path: Path) -> None:
    """Remove a partition directory whose creation failed, without needing a descriptor
    (out of them is a likely reason it failed, and ``rmtree`` opens each directory).

    The metadata goes first: a directory without it is skipped by ``open_all``, so even a
    removal cut short never passes for a created partition.
    """
    stem = segment_stem(0)  # a new log's only segment
    segment_files = (stem + suffix for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX))
    names = (META_FILE, META_FILE + ".tmp", *segment_files)
    try:
        for name in names:
            (path / name).unlink(missing_ok=True)
        path.rmdir()
    except OSError:
        shutil.rmtree(path, ignore_errors=True)
    if path.exists():
        log.warning("could not remove %s after its creation failed; it has no metadata and is ignored", path)


class LogManager:
    """Opens, creates and removes the partition logs of a broker."""

    def __init__(
        self,
        data_dir: Path,
        default_config: LogConfig,
        now_ms: Callable[[], int] = wall_clock_ms,
        read_handles: int = DEFAULT_READ_HANDLES,
        descriptor_reserve: int = DEFAULT_DESCRIPTOR_RESERVE,
        min_free_bytes: int = 0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.default_config = default_config
        self._now_ms = now_ms
        #: Read descriptors of sealed segments, shared by every partition (bounded LRU).
        self.handles = ReadHandles(read_handles)
        self.descriptor_reserve = descriptor_reserve
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._meta: dict[TopicPartition, PartitionMeta] = {}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        #: Free space of the data directory: appends are refused below ``min_free_bytes`` (space.py).
        self.space = DiskSpace(self.data_dir, min_free_bytes)
        #: The last shutdown left no marker: logs opened now verify every batch's CRC.
        self.unclean = self._take_clean_shutdown_marker()
        #: Called with (topic, partition) when a read finds a damaged batch (read_check.py).
        self.on_damage: Callable[[str, int], None] | None = None

    def _take_clean_shutdown_marker(self) -> bool:
        """Whether the last shutdown was unclean; removes the marker (durably) so that a crash
        from now on is seen as one."""
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        if not marker.exists():
            if any(p.is_dir() and not p.name.startswith(DELETED_PREFIX) for p in self.data_dir.iterdir()):
                log.warning("%s: the last shutdown was not clean: every batch is verified", self.data_dir)
            return True
        marker.unlink()
        fsync_dir(self.data_dir)
        return False

    def _dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def open_all(self) -> None:
        """Open (and recover) every partition directory on disk.

        A partition that cannot be opened is logged and left out rather than stopping
        the broker: its other partitions stay available. So are partitions past the
        descriptor budget: opening them would leave no descriptor for connections, a
        broker that runs but cannot be reached (raise the limit and restart).
        """
        budget = self.descriptor_budget()
        over_budget = 0
        for path in sorted(self.data_dir.iterdir()):
            if not path.is_dir():
                continue
            if path.name.startswith(DELETED_PREFIX):
                shutil.rmtree(path, ignore_errors=True)
                continue
            meta = PartitionMeta.read(path)
            if meta is None:
                log.warning("skipping %s: no partition metadata", path)
                continue
            key = (meta.topic, meta.partition)
            if key in self._logs:
                continue
            if path != self._dir(*key):
                log.warning("skipping %s: its metadata names %s-%d", path, *key)
                continue
            if len(self._logs) >= budget:
                over_budget += 1
                continue
            try:
                self._logs[key] = self._open_log(path, meta.config, key)
            except (OSError, SluiceError):
                log.exception("cannot open the log of %s-%d in %s", meta.topic, meta.partition, path)
                continue
            self._meta[key] = meta
        if over_budget:
            log.error(
                "%d partitions on disk were not opened: the descriptor budget is %d (soft open files "
                "limit %d - %d read handles - %d reserved); raise the limit (docs/kubernetes.md) and restart",
                over_budget,
                budget,
                open_files_soft_limit(),
                self.handles.capacity,
                self.descriptor_reserve,
            )

    def get(self, topic: str, partition: int) -> PartitionLog | None:
        return self._logs.get((topic, partition))

    def create(
        self, topic: str, topic_id: str, partition: int, config: LogConfig | None = None
    ) -> PartitionLog:
        """Open the partition's log, creating it if needed. Idempotent.

        Data left by a deleted topic of the same name (a different ``topic_id``) is removed
        first. ``config`` is authoritative: the partition's overrides, or None for the
        manager's default config; a change applies at once and is persisted, so a restart
        uses it before the broker hears from the coordinator again.
        """
        validate_topic(topic)
        if partition < 0:
            raise InvalidPartitions(f"partition must be >= 0, got {partition}")
        if not topic_id:
            raise InvalidArgument("topic_id must not be empty")
        key = (topic, partition)
        path = self._dir(topic, partition)
        existing = self._logs.get(key)
        if existing is not None:
            meta = self._meta[key]
            if meta.topic_id == topic_id:
                if config != meta.config:
                    meta = PartitionMeta(topic, partition, topic_id, config)
                    meta.write(path)
                    self._meta[key] = meta
                    existing.config = config or self.default_config
                return existing
            log.info(
                "%s-%d: replacing data of topic id %s with %s", topic, partition, meta.topic_id, topic_id
            )
            self.remove(topic, partition)
        on_disk = PartitionMeta.read(path) if path.exists() else None
        if path.exists() and (on_disk is None or on_disk.topic_id != topic_id):
            self._remove_dir(path)
            on_disk = None
        self._check_descriptor_budget(topic, partition)
        meta = PartitionMeta(topic, partition, topic_id, config)
        created = not path.exists()
        try:
            path.mkdir(parents=True, exist_ok=True)
            if on_disk != meta:
                meta.write(path)
                fsync_dir(self.data_dir)
            plog = self._open_log(path, meta.config, key)
        except (OSError, StorageError) as exc:
            # All or nothing: a partition that could not be opened leaves no directory that
            # a restart would take for a created partition.
            if created:
                _discard_new_dir(path)
            if isinstance(exc, StorageError):
                raise StorageError(f"cannot create the log of {topic}-{partition}: {exc.message}") from exc
            raise storage_error(f"creating the log of {topic}-{partition}", exc) from exc
        # The metadata first: ``create`` may run in a worker thread (an update's logs: assignment.py),
        # and the event loop must not find a log without its topic id.
        self._meta[key] = meta
        self._logs[key] = plog
        return plog

    def _open_log(self, path: Path, config: LogConfig | None, key: TopicPartition) -> PartitionLog:
        cfg = config or self.default_config
        plog = PartitionLog(path, cfg, self._now_ms, self.handles, verify_all=self.unclean, space=self.space)
        plog.on_damage = lambda: self.on_damage(*key) if self.on_damage is not None else None
        return plog

    def descriptor_budget(self) -> int:
        """How many partition logs this broker can hold open under its soft limit now."""
        return open_files_soft_limit() - self.handles.capacity - self.descriptor_reserve

    def descriptor_stats(self) -> tuple[int, int, int, int, int, int]:
        """(read handles open, capacity, opens, hits, evictions, partition budget), for metrics."""
        h = self.handles
        return len(h), h.capacity, h.opens, h.hits, h.evictions, self.descriptor_budget()

    def _check_descriptor_budget(self, topic: str, partition: int) -> None:
        budget = self.descriptor_budget()
        if len(self._logs) >= budget:
            raise StorageError(
                f"cannot create the log of {topic}-{partition}: out of file descriptors "
                f"({len(self._logs)} partitions open, budget {max(budget, 0)} = soft open files "
                f"limit {open_files_soft_limit()} - {self.handles.capacity} read handles - "
                f"{self.descriptor_reserve} reserved); raise the limit (docs/kubernetes.md) "
                "or remove partitions"
            )

    def remove(self, topic: str, partition: int) -> None:
        """Close the partition's log (if open) and delete its data (if any)."""
        key = (topic, partition)
        plog = self._logs.pop(key, None)
        self._meta.pop(key, None)
        if plog is not None:
            plog.delete()
        path = self._dir(topic, partition)
        if path.exists():
            self._remove_dir(path)

    def _remove_dir(self, path: Path) -> None:
        grave = self.data_dir / f"{DELETED_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}"
        os.rename(path, grave)
        shutil.rmtree(grave, ignore_errors=True)

    def partitions(self) -> dict[TopicPartition, PartitionLog]:
        return dict(self._logs)

    def topic_id(self, topic: str, partition: int) -> str | None:
        meta = self._meta.get((topic, partition))
        return None if meta is None else meta.topic_id

    def flush_all(self) -> None:
        """Flush every log; raises the first failure after trying them all."""
        first_error: StorageError | None = None
        for plog in list(self._logs.values()):
            try:
                plog.flush()
            except StorageError as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error

    def apply_retention_all(self) -> int:
        return sum(plog.apply_retention() for plog in list(self._logs.values()))

    def close(self) -> None:
        """Flush and close every log; if all of them closed cleanly and none holds damaged
        batches, write the clean-shutdown marker (fsynced), so the next open trusts the
        segments' tails instead of verifying every batch."""
        # A log with damaged batches keeps the marker away: the next open verifies again and
        # finds them, since which batches are damaged is known only in memory.
        clean = not any(plog.corrupt_ranges for plog in self._logs.values())
        for plog in self._logs.values():
            try:
                plog.close()
            except (OSError, SluiceError):
                clean = False
                log.exception("closing %r failed", plog)
        self._logs.clear()
        self._meta.clear()
        self.handles.close_all()
        if clean:
            try:
                with open(self.data_dir / CLEAN_SHUTDOWN_FILE, "wb") as f:
                    os.fsync(f.fileno())
                fsync_dir(self.data_dir)
            except OSError as exc:
                log.warning("could not write the clean-shutdown marker: %s", exc)
