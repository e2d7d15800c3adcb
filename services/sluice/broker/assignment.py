"""Which partitions this broker serves, and how an UpdatePartitions request changes that.

The coordinator places partitions on brokers and tells each broker its share with
``UpdatePartitions`` (pushed, and returned by the broker heartbeat). The rules:

- ``assign`` creates a partition's log if it has none, and serves it. A log left over from a
  deleted topic of the same name (another ``topic_id``) is deleted and created afresh.
- ``remove`` stops serving a partition and deletes its data. A removal naming another
  ``topic_id`` than the log's is stale (an older incarnation of the topic) and is ignored.
- ``full = true``: ``assign`` is the broker's complete assignment. Partitions not in it stop
  being served (NOT_LEADER) but their data stays: only an explicit ``remove`` deletes data.

A partition that is not served answers NOT_LEADER when the broker knows its topic (it holds
a log of it) and UNKNOWN_TOPIC_OR_PARTITION otherwise.

The served set is kept in ``<data_dir>/.broker-assignment.json`` so that a restarted broker
serves what it served before, without waiting for the coordinator.

:func:`plan_update` is pure; :class:`PartitionRegistry` applies a plan to the log manager.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.log.config import LogConfig
from sluice.broker.log.manager import LogManager
from sluice.broker.log.partition_log import PartitionLog
from sluice.common.names import MAX_PARTITIONS, validate_topic
from sluice.errors import InvalidArgument, InvalidPartitions, NotLeader, SluiceError, UnknownTopicOrPartition

log = logging.getLogger(__name__)

STATE_FILE = ".broker-assignment.json"


@dataclass(frozen=True, slots=True)
class TopicOverrides:
    """Per-topic log settings from the coordinator; 0 means the broker default."""

    retention_ms: int = 0
    retention_bytes: int = 0
    segment_bytes: int = 0
    segment_ms: int = 0
    max_batch_bytes: int = 0

    def log_config(self, defaults: LogConfig) -> LogConfig | None:
        """The partition's LogConfig; None when nothing overrides the broker default."""
        changes = {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) != 0}
        return dataclasses.replace(defaults, **changes) if changes else None


@dataclass(frozen=True, slots=True)
class PartitionAssignment:
    topic: str
    topic_id: str
    partition: int
    config: TopicOverrides = TopicOverrides()

    @property
    def key(self) -> TopicPartitionKey:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class AssignmentUpdate:
    """The domain form of ``UpdatePartitionsRequest``."""

    metadata_version: int = 0
    full: bool = False
    assign: tuple[PartitionAssignment, ...] = ()
    remove: tuple[PartitionAssignment, ...] = ()


@dataclass(slots=True)
class UpdatePlan:
    """What applying an update does, in this order: delete, replace, create, then serve."""

    delete: list[TopicPartitionKey] = field(default_factory=list)
    #: Logs of a deleted topic incarnation: delete, then create anew.
    replace: list[PartitionAssignment] = field(default_factory=list)
    create: list[PartitionAssignment] = field(default_factory=list)
    #: Existing logs that stay: their topic config is re-applied (a no-op when unchanged).
    keep: list[PartitionAssignment] = field(default_factory=list)
    serve: set[TopicPartitionKey] = field(default_factory=set)


def validate_update(update: AssignmentUpdate) -> None:
    """Reject an update naming an invalid topic or partition, before anything changes."""
    for item in (*update.assign, *update.remove):
        validate_topic(item.topic)
        if not 0 <= item.partition < MAX_PARTITIONS:
            raise InvalidPartitions(f"partition {item.partition} of {item.topic} is out of range")
    for item in update.assign:
        if not item.topic_id:
            raise InvalidArgument(f"assignment of {item.topic}/{item.partition} has no topic_id")
        item.config.log_config(LogConfig())  # rejects invalid overrides before anything changes


def plan_update(
    served: set[TopicPartitionKey],
    on_disk: Mapping[TopicPartitionKey, str],
    update: AssignmentUpdate,
) -> UpdatePlan:
    """Decide what an update does, given the served set and on-disk logs (key -> topic_id).

    Worked example: served {a/0, a/1}, on disk {a/0: X, a/1: X, b/0: Y}; a full update
    assigning a/0 (X) and c/0 (Z) and removing b/0 (Y) gives delete [b/0], create [c/0] and
    serve {a/0, c/0}: a/1 stops being served but keeps its data.
    """
    plan = UpdatePlan(serve=set() if update.full else set(served))
    for item in update.assign:
        current = on_disk.get(item.key)
        if current is None:
            plan.create.append(item)
        elif item.topic_id and current and current != item.topic_id:
            plan.replace.append(item)
        else:
            plan.keep.append(item)
        plan.serve.add(item.key)
    for item in update.remove:
        current = on_disk.get(item.key)
        if item.topic_id and current and current != item.topic_id:
            log.info(
                "ignoring stale removal of %s/%s (topic id %s, log has %s)", *item.key, item.topic_id, current
            )
            continue
        plan.serve.discard(item.key)
        plan.create = [c for c in plan.create if c.key != item.key]
        plan.replace = [r for r in plan.replace if r.key != item.key]
        plan.keep = [k for k in plan.keep if k.key != item.key]
        if current is not None:
            plan.delete.append(item.key)
    return plan


def is_stale(update: AssignmentUpdate, applied_version: int) -> bool:
    """The versioning contract with the coordinator (docs/coordinator.md).

    A broker's applied version only grows: a full update older than it, or an incremental one
    not newer than it, is stale. A broker that has applied nothing yet (version 0, e.g. just
    restarted) takes only a full update, since a delta assumes a base it does not have.
    Version 0 updates do not come from a coordinator (a standalone broker, an operator) and
    always apply.
    """
    version = update.metadata_version
    if version <= 0:
        return False
    if update.full:
        return version < applied_version
    return applied_version == 0 or version <= applied_version


Hook = Callable[[TopicPartitionKey, PartitionLog], None]


class PartitionRegistry:
    """The served partitions of this broker, on top of the log manager.

    Caller: the service. ``on_serve``/``on_unserve`` let it attach and detach append
    listeners; ``on_unserve`` runs before a log is closed or deleted.
    """

    def __init__(
        self,
        logs: LogManager,
        defaults: LogConfig,
        data_dir: Path,
        on_serve: Hook,
        on_unserve: Hook,
    ) -> None:
        self.logs = logs
        self.defaults = defaults
        self.state_path = data_dir / STATE_FILE
        self._on_serve = on_serve
        self._on_unserve = on_unserve
        self.served: dict[TopicPartitionKey, PartitionLog] = {}
        self.metadata_version = 0

    # ---- lookups (hot path) --------------------------------------------------------

    def lookup(self, topic: str, partition: int) -> PartitionLog:
        """The served log of a partition, or the typed error saying why not."""
        plog = self.served.get((topic, partition))
        if plog is not None:
            return plog
        raise self.not_served_error(topic, partition)

    def not_served_error(self, topic: str, partition: int) -> SluiceError:
        try:
            validate_topic(topic)
        except SluiceError as err:
            return err
        if partition >= 0 and (self.logs.get(topic, partition) is not None or topic in self._disk_topics()):
            return NotLeader(f"partition {topic}/{partition} is not served by this broker: refresh metadata")
        return UnknownTopicOrPartition(f"unknown topic or partition {topic}/{partition}")

    def _disk_topics(self) -> set[str]:
        return {t for t, _ in self.logs.partitions()}

    # ---- startup -------------------------------------------------------------------

    def load(self) -> None:
        """Serve what was served before a restart (all on-disk logs if nothing was recorded)."""
        on_disk = set(self.logs.partitions())
        wanted: Iterable[TopicPartitionKey] = on_disk
        try:
            raw = json.loads(self.state_path.read_text())
            # The metadata version is not restored: a fresh process reports 0, so the
            # coordinator sends it a full assignment on its first heartbeat.
            wanted = {(str(t), int(p)) for t, p in raw["served"]}
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable %s (%s): serving every local partition", self.state_path, exc)
        for key in sorted(set(wanted) & on_disk):
            plog = self.logs.get(*key)
            if plog is not None:
                self._serve(key, plog)

    # ---- updates -------------------------------------------------------------------

    def apply(self, update: AssignmentUpdate) -> UpdatePlan | None:
        """Apply an update; returns the plan, or None when the update was stale."""
        validate_update(update)
        if is_stale(update, self.metadata_version):
            log.info(
                "ignoring stale %s partition update v%d (have v%d)",
                "full" if update.full else "incremental",
                update.metadata_version,
                self.metadata_version,
            )
            return None
        on_disk = {key: self.logs.topic_id(*key) or "" for key in self.logs.partitions()}
        plan = plan_update(set(self.served), on_disk, update)
        for key in list(self.served):
            if key not in plan.serve or key in plan.delete or any(r.key == key for r in plan.replace):
                self._unserve(key)
        for key in plan.delete:
            self.logs.remove(*key)
        for item in plan.replace:
            self.logs.remove(*item.key)
        for item in (*plan.replace, *plan.create, *plan.keep):
            self.logs.create(item.topic, item.topic_id, item.partition, item.config.log_config(self.defaults))
        for key in sorted(plan.serve):
            if key not in self.served:
                plog = self.logs.get(*key)
                if plog is not None:
                    self._serve(key, plog)
        self.metadata_version = max(self.metadata_version, update.metadata_version)
        self._save()
        return plan

    def _serve(self, key: TopicPartitionKey, plog: PartitionLog) -> None:
        self.served[key] = plog
        self._on_serve(key, plog)

    def _unserve(self, key: TopicPartitionKey) -> None:
        plog = self.served.pop(key, None)
        if plog is not None:
            self._on_unserve(key, plog)

    def unserve_all(self) -> None:
        for key in list(self.served):
            self._unserve(key)

    def _save(self) -> None:
        state = {"metadata_version": self.metadata_version, "served": sorted(self.served)}
        tmp = self.state_path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)
        with contextlib.suppress(OSError):
            fd = os.open(self.state_path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
