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

Replication (``roles.py``): an assignment names the partition's leader. This broker *serves* the
partitions it leads; those it follows are hosted (their logs exist and are kept up to date by
assignments) but not served, so clients get NOT_LEADER. Updates from an older controller epoch are
refused, and assignments older than the partition's newest (leader epoch, partition epoch) are ignored.

The served set is kept in an append-only journal over a snapshot (``assignment_journal.py``) so
that a restarted broker serves what it served before, without waiting for the coordinator; an
update costs the partitions it names, never all of them (docs/storage.md).

:func:`plan_update` is pure; :class:`PartitionRegistry` applies a plan to the log manager.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from sluice.broker.assignment_journal import AssignmentJournal, JournalRecovery
from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.log.config import LogConfig
from sluice.broker.log.manager import LogManager
from sluice.broker.log.partition_log import PartitionLog
from sluice.broker.roles import EpochBook, EpochMark, Role, role_of
from sluice.common.names import MAX_PARTITIONS, validate_topic
from sluice.errors import (
    InvalidArgument,
    InvalidPartitions,
    NotLeader,
    SluiceError,
    StorageError,
    UnknownTopicOrPartition,
)

log = logging.getLogger(__name__)


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


Hook = Callable[[TopicPartitionKey, PartitionLog], None]


class _OnDisk(Mapping[TopicPartitionKey, str]):
    """The log manager's topic ids as the Mapping ``plan_update`` reads: a view, so a lookup costs
    one dict access instead of a copy of every partition's id."""

    def __init__(self, logs: LogManager) -> None:
        self._logs = logs

    def __getitem__(self, key: TopicPartitionKey) -> str:
        if self._logs.get(*key) is None:
            raise KeyError(key)
        return self._logs.topic_id(*key) or ""

    def __iter__(self) -> Iterator[TopicPartitionKey]:
        return iter(self._logs.partitions())

    def __len__(self) -> int:
        return len(self._logs.partitions())


class PartitionRegistry:
    """The served partitions of this broker, on top of the log manager.

    Caller: the service. ``on_serve``/``on_unserve`` let it attach and detach append
    listeners; ``on_unserve`` runs before a log is closed or deleted. Every change of the
    served set is appended to the assignment journal (``assignment_journal.py``) before
    ``apply`` returns.
    """

    def __init__(
        self,
        logs: LogManager,
        defaults: LogConfig,
        data_dir: Path,
        on_serve: Hook,
        on_unserve: Hook,
        broker_id: int = -1,
    ) -> None:
        self.logs = logs
        self.defaults = defaults
        self.broker_id = broker_id
        self.journal = AssignmentJournal(data_dir)
        #: The highest controller epoch and per-partition epochs seen (journaled; roles.py).
        self.epochs = EpochBook()
        #: Hosted partitions this broker follows: not served (clients get NOT_LEADER naming the leader).
        self.following: dict[TopicPartitionKey, PartitionAssignment] = {}
        #: Replicated partitions this broker served before a restart, held back until the controller's
        #: first full assignment says who leads now.
        self.held: set[TopicPartitionKey] = set()
        self._on_serve = on_serve
        self._on_unserve = on_unserve
        self.served: dict[TopicPartitionKey, PartitionLog] = {}
        self.metadata_version = 0
        #: What the last ``load`` found in the journal (tests, and the corruption it reports).
        self.recovery = JournalRecovery()
        #: topic -> number of its logs on disk: tells NOT_LEADER from UNKNOWN_TOPIC in O(1).
        self._disk_topics: Counter[str] = Counter()
        #: Partitions touched by ``apply`` since start (a measure of its cost, for tests).
        self.touched = 0

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
        if (topic, partition) in self.held:
            return NotLeader(
                f"partition {topic}/{partition} is replicated and this broker restarted: it waits for the "
                "controller to confirm who leads (its next heartbeat); refresh metadata"
            )
        followed = self.following.get((topic, partition))
        if followed is not None:
            return NotLeader(
                f"partition {topic}/{partition} is led by broker {followed.leader} (leader epoch "
                f"{followed.leader_epoch}); this broker is a follower: refresh metadata"
            )
        if partition >= 0 and (self.logs.get(topic, partition) is not None or self._disk_topics[topic] > 0):
            return NotLeader(f"partition {topic}/{partition} is not served by this broker: refresh metadata")
        return UnknownTopicOrPartition(f"unknown topic or partition {topic}/{partition}")

    # ---- startup -------------------------------------------------------------------

    def load(self) -> None:
        """Serve what was served before a restart (all on-disk logs if nothing was recorded), then
        start a fresh journal generation holding exactly that."""
        on_disk = self.logs.partitions()
        self._disk_topics = Counter(topic for topic, _ in on_disk)
        # The metadata version is not restored: a fresh process reports 0, so the
        # coordinator sends it a full assignment on its first heartbeat.
        self.recovery = self.journal.recover()
        for problem in self.recovery.corruption:
            log.warning("assignment journal: %s", problem)
        self.epochs = EpochBook(self.recovery.controller_epoch, self.recovery.epochs)
        wanted = on_disk.keys() if self.recovery.served is None else self.recovery.served
        # A replicated partition may have a new leader since this broker stopped: serving it on the
        # journal's word could accept writes a successor never sees. Unreplicated ones serve at once.
        marks = self.epochs.marks
        self.held = {k for k in wanted & on_disk.keys() if (m := marks.get(k)) is not None and m.replicated}
        for key in sorted(wanted & on_disk.keys() - self.held):
            self._serve(key, on_disk[key])
        if self.held:
            log.info("%d replicated partitions wait for the controller before serving", len(self.held))
        self._compact()

    def _compact(self) -> None:
        try:
            # Marks of partitions whose logs are gone (deleted topics) are dropped here, at O(P) cost
            # the compaction pays anyway: a re-created topic has another topic_id and starts afresh.
            marks = {k: m for k, m in self.epochs.marks.items() if self.logs.get(*k) is not None}
            self.journal.compact(self.served, marks, self.epochs.controller_epoch)
            self.epochs.marks = marks
        except OSError as exc:
            raise self._journal_error(exc) from exc

    # ---- updates -------------------------------------------------------------------

    def apply(self, update: AssignmentUpdate) -> UpdatePlan | None:
        """Apply an update; returns the plan, or None when the update was stale.

        Costs O(partitions the update names) (plus O(served) for a full update): nothing here
        walks every partition. The served-set changes are journaled (one fsync) even when a log
        cannot be created half way; the version then stays put, so the coordinator sends it again.
        """
        validate_update(update)
        newer_controller = self.epochs.check_controller(update.controller_epoch)
        if is_stale(update, self.metadata_version):
            log.info(
                "ignoring stale %s partition update v%d (have v%d)",
                "full" if update.full else "incremental",
                update.metadata_version,
                self.metadata_version,
            )
            if newer_controller:  # the term is news even when the update is not
                self._journal([], set(), {}, update.controller_epoch)
            return None
        stale = {item.key for item in update.assign if self.epochs.is_stale(item)}
        plan = plan_update(self.served.keys(), _OnDisk(self.logs), update, self.broker_id, stale)
        added: list[TopicPartitionKey] = []
        dropped: set[TopicPartitionKey] = set()
        marks = self.epochs.newer_marks(
            item for item in update.assign if item.key in plan.assigned or item.key in plan.follow
        )
        try:
            self._apply_plan(plan, added, dropped)
        finally:
            self._set_roles(plan)
            self._journal(added, dropped, marks, update.controller_epoch if newer_controller else 0)
        self.metadata_version = max(self.metadata_version, update.metadata_version)
        return plan

    def _set_roles(self, plan: UpdatePlan) -> None:
        if plan.full:  # the whole assignment: it says what this broker leads and follows
            self.held = set()
            self.following = {k: v for k, v in self.following.items() if k in plan.untouched}
        else:
            self.held.difference_update(plan.assigned, plan.follow, plan.removed)
            for key in (*plan.unserve, *plan.removed, *plan.assigned):
                self.following.pop(key, None)
        self.following.update(plan.follow)

    def _apply_plan(
        self, plan: UpdatePlan, added: list[TopicPartitionKey], dropped: set[TopicPartitionKey]
    ) -> None:
        replaced = [r.key for r in plan.replace]
        for key in (*plan.unserve, *plan.delete, *replaced):
            if self._unserve(key):
                dropped.add(key)
        for key in (*plan.delete, *replaced):
            self._remove_log(key)
        # A log that cannot be created does not stop the others: they are created and served, and
        # the update then fails naming the ones that were not (the version stays, so it comes again).
        failed: dict[TopicPartitionKey, StorageError] = {}
        for item in (*plan.replace, *plan.create, *plan.keep):
            try:
                self._create_log(item)
            except StorageError as exc:
                failed[item.key] = exc
        for key in sorted(plan.assigned):
            if key not in self.served and key not in failed:
                plog = self.logs.get(*key)
                if plog is not None:
                    self._serve(key, plog)
                    added.append(key)
        if failed:
            names = ", ".join(f"{t}-{p}" for t, p in sorted(failed)[:5])
            names += ", ..." if len(failed) > 5 else ""
            raise StorageError(
                f"could not create {len(failed)} of {len(plan.assigned)} assigned partition logs "
                f"({names}): {next(iter(failed.values())).message}"
            )

    def _journal(
        self,
        added: list[TopicPartitionKey],
        dropped: set[TopicPartitionKey],
        marks: dict[TopicPartitionKey, EpochMark],
        controller_epoch: int,
    ) -> None:
        """Journal the update's changes (one fsync) before it is acknowledged; the epochs are taken
        into the book only once durable, so a failed append never lets a broker act on an epoch it
        would forget in a restart."""
        unserved = dropped.difference(added)
        if not added and not unserved and not marks and not controller_epoch:
            return  # most updates of a broker change nothing here (another broker's topic)
        try:
            self.journal.append(added, unserved, marks, controller_epoch)
        except OSError as exc:
            raise self._journal_error(exc) from exc
        self.epochs.marks.update(marks)
        if controller_epoch:
            self.epochs.controller_epoch = controller_epoch
        if self.journal.wants_compaction():
            self._compact()

    def _journal_error(self, exc: OSError) -> StorageError:
        return StorageError(f"cannot write the assignment journal in {self.journal.data_dir}: {exc}")

    def _create_log(self, item: PartitionAssignment) -> None:
        self.touched += 1
        known = self.logs.get(*item.key) is not None
        self.logs.create(item.topic, item.topic_id, item.partition, item.config.log_config(self.defaults))
        if not known:
            self._disk_topics[item.topic] += 1

    def _remove_log(self, key: TopicPartitionKey) -> None:
        self.touched += 1
        if self.logs.get(*key) is not None:
            self._disk_topics[key[0]] -= 1
            if self._disk_topics[key[0]] <= 0:
                del self._disk_topics[key[0]]
        self.logs.remove(*key)

    def _serve(self, key: TopicPartitionKey, plog: PartitionLog) -> None:
        self.touched += 1
        self.served[key] = plog
        self._on_serve(key, plog)

    def _unserve(self, key: TopicPartitionKey) -> bool:
        plog = self.served.pop(key, None)
        if plog is None:
            return False
        self.touched += 1
        self._on_unserve(key, plog)
        return True

    def unserve_all(self) -> None:
        """Stop serving everything (shutdown). Not journaled: a restart serves the same set again."""
        for key in list(self.served):
            self._unserve(key)

    def close(self) -> None:
        self.unserve_all()
        self.journal.close()
