"""What an ``UpdatePartitions`` request says and what applying it does: the domain types and the pure planner.

:class:`AssignmentUpdate` is the domain form of the request, :func:`plan_update` decides what applying it
changes (given the served set and the logs on disk), :func:`is_stale` is the versioning contract with the
coordinator. Pure: the registry (``assignment.py``) applies a plan to the log manager and journals it
(docs/storage.md, "The assignment journal").
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.log.config import LogConfig
from sluice.broker.roles import EpochMark, Role, role_of
from sluice.common.names import MAX_PARTITIONS, validate_topic
from sluice.errors import InvalidArgument, InvalidPartitions

log = logging.getLogger(__name__)

__all__ = [
    "AssignmentUpdate",
    "PartitionAssignment",
    "TopicOverrides",
    "UpdatePlan",
    "is_stale",
    "plan_update",
    "validate_update",
]


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
    #: The leader's broker id; None in an update without replica state (from before replication, or a
    #: standalone sender): this broker leads.
    leader: int | None = None
    leader_epoch: int = 0
    partition_epoch: int = 0
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    min_insync_replicas: int = 1
    #: A reassignment's replication throttle (bytes/s, 0: none) for followers outside the ISR.
    throttle_bytes_per_second: int = 0

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
    #: The sending coordinator's term; 0: none (never refused).
    controller_epoch: int = 0


@dataclass(slots=True)
class UpdatePlan:
    """What applying an update does, in this order: unserve, delete, replace, create, then serve.

    Only the partitions the update names are in it (a full update also names, in ``unserve``, the
    served partitions it leaves out), so applying it costs O(update), not O(partitions served).
    """

    #: The served set the plan was made against (a live view, not a copy).
    base: AbstractSet[TopicPartitionKey] = field(default_factory=frozenset)
    full: bool = False
    delete: list[TopicPartitionKey] = field(default_factory=list)
    #: Logs of a deleted topic incarnation: delete, then create anew.
    replace: list[PartitionAssignment] = field(default_factory=list)
    create: list[PartitionAssignment] = field(default_factory=list)
    #: Existing logs that stay: their topic config is re-applied (a no-op when unchanged).
    keep: list[PartitionAssignment] = field(default_factory=list)
    #: Partitions served after the update because it assigns them (with this broker as leader).
    assigned: set[TopicPartitionKey] = field(default_factory=set)
    #: Partitions the update assigns to this broker as a follower: hosted, not served.
    follow: dict[TopicPartitionKey, PartitionAssignment] = field(default_factory=dict)
    #: Assignments ignored as stale (older epochs): these partitions keep what they had.
    untouched: AbstractSet[TopicPartitionKey] = field(default_factory=frozenset)
    #: Partitions removed by the update (not stale).
    removed: set[TopicPartitionKey] = field(default_factory=set)
    #: Served partitions that stop being served (removed, or left out of a full update).
    unserve: set[TopicPartitionKey] = field(default_factory=set)
    #: Set by ``PartitionRegistry.begin``, journaled by ``finish``: the partitions it stopped serving,
    #: the epochs the update changes and its controller epoch when newer (else 0).
    dropped: set[TopicPartitionKey] = field(default_factory=set)
    marks: dict[TopicPartitionKey, EpochMark] = field(default_factory=dict)
    controller_epoch: int = 0

    @property
    def serve(self) -> set[TopicPartitionKey]:
        """The whole served set after the update. O(served): for tests and logs, not for ``apply``."""
        kept = set() if self.full else set(self.base) - self.removed
        return kept | self.assigned


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
    served: AbstractSet[TopicPartitionKey],
    on_disk: Mapping[TopicPartitionKey, str],
    update: AssignmentUpdate,
    broker_id: int = -1,
    untouched: AbstractSet[TopicPartitionKey] = frozenset(),
) -> UpdatePlan:
    """Decide what an update does, given the served set and on-disk logs (key -> topic_id).

    Only keys the update names are looked up in ``served`` and ``on_disk``, except that a full update
    computes ``served - assigned``. A removal wins over an assignment of the same key. An assignment
    naming another broker as leader makes this broker a follower (``follow``: the log is created or
    kept, the partition not served). ``untouched`` keys (stale assignments) keep whatever they had.

    Worked example: served {a/0, a/1}, on disk {a/0: X, a/1: X, b/0: Y}; a full update
    assigning a/0 (X) and c/0 (Z) and removing b/0 (Y) gives delete [b/0], create [c/0] and
    serve {a/0, c/0}: a/1 stops being served but keeps its data.
    """
    plan = UpdatePlan(base=served, full=update.full, untouched=untouched)
    assigned = {item.key: item for item in update.assign}
    for item in update.remove:
        current = on_disk.get(item.key)
        if item.topic_id and current and current != item.topic_id:
            log.info(
                "ignoring stale removal of %s/%s (topic id %s, log has %s)", *item.key, item.topic_id, current
            )
            continue
        assigned.pop(item.key, None)
        if item.key in plan.removed:
            continue  # named twice
        plan.removed.add(item.key)
        if current is not None:
            plan.delete.append(item.key)
    for key in untouched:
        assigned.pop(key, None)
    for item in assigned.values():
        current = on_disk.get(item.key)
        if current is None:
            plan.create.append(item)
        elif item.topic_id and current and current != item.topic_id:
            plan.replace.append(item)
        else:
            plan.keep.append(item)
        if role_of(item, broker_id) is Role.FOLLOWER:
            plan.follow[item.key] = item
    plan.assigned = {key for key in assigned if key not in plan.follow}
    if update.full:
        plan.unserve = {key for key in served if key not in plan.assigned and key not in untouched}
    else:
        plan.unserve = {key for key in (*plan.removed, *plan.follow) if key in served}
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
