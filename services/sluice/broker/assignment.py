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

:func:`plan_update` (``update_plan.py``) is pure; :class:`PartitionRegistry` applies a plan to the log
manager, in three steps so that the file work can run off the event loop (``update_runner.py``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from sluice.broker.assignment_journal import AssignmentJournal, JournalRecovery
from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.log.config import LogConfig
from sluice.broker.log.manager import LogManager
from sluice.broker.log.partition_log import PartitionLog
from sluice.broker.roles import EpochBook, EpochMark
from sluice.broker.update_plan import (
    AssignmentUpdate,
    PartitionAssignment,
    TopicOverrides,
    UpdatePlan,
    is_stale,
    plan_update,
    validate_update,
)
from sluice.common.names import validate_topic
from sluice.errors import NotLeader, SluiceError, StorageError, UnknownTopicOrPartition

log = logging.getLogger(__name__)

# The request's domain types and the pure planner live in ``update_plan.py``; callers import them from here.
__all__ = [
    "AssignmentUpdate",
    "PartitionAssignment",
    "PartitionRegistry",
    "TopicOverrides",
    "UpdatePlan",
    "is_stale",
    "plan_update",
    "validate_update",
]

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
        #: Partitions the controller last sent at epochs older than this broker's marks (its metadata
        #: store lost changes): reported in heartbeats until it sends newer ones (epoch_reports.py).
        self.ahead: set[TopicPartitionKey] = set()
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

        Three steps, for a caller that runs the file work elsewhere (the broker service runs
        :meth:`create_logs` in a worker thread, ``update_runner.py``): :meth:`begin` (unserve,
        delete), :meth:`create_logs`, :meth:`finish` (serve, roles, journal with the epochs).
        """
        plan = self.begin(update)
        if plan is not None:
            self.finish(plan, update, self.create_logs(self.new_logs(plan)))
        return plan

    def begin(self, update: AssignmentUpdate) -> UpdatePlan | None:
        """Validate (an older controller epoch refuses the whole update before anything changes), plan
        against the epochs held, stop serving what the update unserves and delete what it deletes or
        replaces. None when the update is stale (a newer controller epoch is journaled all the same)."""
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
        self._track_ahead(update, stale)
        plan = plan_update(self.served.keys(), _OnDisk(self.logs), update, self.broker_id, stale)
        plan.marks = self.epochs.newer_marks(
            item for item in update.assign if item.key in plan.assigned or item.key in plan.follow
        )
        plan.controller_epoch = update.controller_epoch if newer_controller else 0
        try:
            replaced = [r.key for r in plan.replace]
            for key in (*plan.unserve, *plan.delete, *replaced):
                if self._unserve(key):
                    plan.dropped.add(key)
            for key in (*plan.delete, *replaced):
                self._remove_log(key)
        except BaseException:
            self._conclude(plan, [])  # roles, and what changed before the failure, journaled
            raise
        return plan

    def _track_ahead(self, update: AssignmentUpdate, stale: set[TopicPartitionKey]) -> None:
        if update.full:
            self.ahead = stale
            return
        self.ahead.difference_update(item.key for item in (*update.assign, *update.remove))
        self.ahead.update(stale)

    @staticmethod
    def new_logs(plan: UpdatePlan) -> list[PartitionAssignment]:
        """The logs the plan creates (replaced ones included): the file work of an update."""
        return [*plan.replace, *plan.create]

    def create_logs(self, items: list[PartitionAssignment]) -> dict[TopicPartitionKey, StorageError]:
        """Create these logs on disk; returns the ones that could not be (the others are created: a
        failure does not stop them). Safe in a worker thread while the event loop serves: it touches no
        served partition and no state of this registry, only the log manager's table of logs."""
        failed: dict[TopicPartitionKey, StorageError] = {}
        for item in items:
            try:
                self.logs.create(
                    item.topic, item.topic_id, item.partition, item.config.log_config(self.defaults)
                )
            except StorageError as exc:
                failed[item.key] = exc
        return failed

    def finish(
        self, plan: UpdatePlan, update: AssignmentUpdate, failed: dict[TopicPartitionKey, StorageError]
    ) -> None:
        """After :meth:`create_logs`: re-apply the config of kept logs, serve what the update assigns
        whose log exists, set the roles, journal it all with the update's epochs (one fsync), and take
        its version; unless a log could not be created: then raise naming them (the version stays, so
        the update comes again)."""
        for item in self.new_logs(plan):
            self.touched += 1
            if item.key not in failed:
                self._disk_topics[item.topic] += 1
        for item in plan.keep:
            try:
                self._create_log(item)
            except StorageError as exc:
                failed[item.key] = exc
        added: list[TopicPartitionKey] = []
        try:
            for key in sorted(plan.assigned):
                if key not in self.served and key not in failed:
                    plog = self.logs.get(*key)
                    if plog is not None:
                        self._serve(key, plog)
                        added.append(key)
        finally:
            self._conclude(plan, added)
        if failed:
            names = ", ".join(f"{t}-{p}" for t, p in sorted(failed)[:5])
            names += ", ..." if len(failed) > 5 else ""
            raise StorageError(
                f"could not create {len(failed)} of {len(plan.assigned)} assigned partition logs "
                f"({names}): {next(iter(failed.values())).message}"
            )
        self.metadata_version = max(self.metadata_version, update.metadata_version)

    def _conclude(self, plan: UpdatePlan, added: list[TopicPartitionKey]) -> None:
        self._set_roles(plan)
        self._journal(added, plan.dropped, plan.marks, plan.controller_epoch)

    def _set_roles(self, plan: UpdatePlan) -> None:
        if plan.full:  # the whole assignment: it says what this broker leads and follows
            self.held = set()
            self.following = {k: v for k, v in self.following.items() if k in plan.untouched}
        else:
            self.held.difference_update(plan.assigned, plan.follow, plan.removed)
            for key in (*plan.unserve, *plan.removed, *plan.assigned):
                self.following.pop(key, None)
        self.following.update(plan.follow)

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
