"""The consumer groups' timer: expiry of silent members and idle tracks, throttled target assignments,
and reacting to subscribed topics being deleted or recreated. Pure: the caller passes the time.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluice.coordinator.groups.assignment import AssignmentJob
from sluice.coordinator.groups.group import Group
from sluice.coordinator.groups.model import DEFAULT_TRACK, Slot, TickOutcome
from sluice.coordinator.groups.planning import GroupsBase
from sluice.coordinator.groups.records import group_tombstones, new_group_metadata_record, new_target_record
from sluice.coordinator.groups.targets import choose_assignor
from sluice.coordinator.groups.tracks import expire_tracks
from sluice.coordinator.records import Record, Result

#: Whole groups expired per write at most: 10,000 groups expiring at once are ~40 writes, and requests
#: get the write lock between them.
EXPIRE_BATCH = 256


class GroupTimer(GroupsBase):
    """``tick`` and the off-loop assignment jobs (``assignment.py``). Mixed into :class:`GroupsState`."""

    # ---- the timer ------------------------------------------------------------------------------

    def tick(self, now_ms: int, sweep: bool = True, assign_inline: bool = True) -> Result[TickOutcome]:
        """Expire silent members, fence members that did not release in time, compute targets that were
        throttled, and react to subscribed topics being deleted or recreated. Caller: the service's timer.

        One group changes per call at most (its records are one write); the caller calls again while
        ``assigned_groups`` or ``removed`` is non-empty. Sessions and rebalance deadlines are checked
        only when ``sweep`` (every few ticks; it reads only members silent for longer than the group's
        shortest session timeout, and those with partitions to release). Without ``assign_inline`` the
        caller computes throttled targets itself (``assignment_jobs`` / ``apply_assignment``, in a thread).
        """
        if sweep:
            expired = self._expire_due(now_ms)
            if expired is not None:
                return expired
        for name in list(self.live):  # only groups with members have sessions and targets
            g = self.groups.get(name)
            if g is None or not g.members:
                continue
            removed = self._overdue(g, now_ms) if sweep else []
            if removed:
                change = self._plan(g, now_ms, None, [mid for mid, _ in removed], force=False)
                for mid, _ in removed:
                    self.soft.forget(g.group_id, mid)
                return Result(
                    TickOutcome(removed=tuple((g.group_id, mid, why) for mid, why in removed)),
                    tuple(change.records),
                )
            soft = self.soft.group(g.group_id)
            if soft.metadata_version != self.topics.metadata_version:
                snapshot = self._snapshot(g.members.values())
                stale = soft.topics is not None and snapshot != soft.topics
                soft.metadata_version = self.topics.metadata_version
                soft.topics = snapshot
                if stale:
                    change = self._plan(g, now_ms, None, (), force=True)
                    return Result(TickOutcome(assigned_groups=(g.group_id,)), tuple(change.records))
            if assign_inline and self._assignment_due(g, now_ms):
                job = self._assignment_job(g)
                return self.apply_assignment(job, job.compute(), now_ms)
        return Result(TickOutcome())

    def _expire_due(self, now_ms: int) -> Result[TickOutcome] | None:
        """What the offsets retention expires now (``deadlines.py`` says which groups are due; nothing
        else is looked at). An empty group whose every binding expires goes whole: its records, and in
        the same write every key it has in Redis (``redis_ops.py``: the group's tombstone deletes them),
        as Kafka removes an empty group with its offsets. Up to ``EXPIRE_BATCH`` such groups per write.
        Otherwise one group's expired bindings (the rest of the group stays): one write of its own."""
        retention = self.settings.offsets_retention_ms
        records: list[Record] = []
        gone: list[str] = []
        for name in self.deadlines.pop_due(now_ms, EXPIRE_BATCH):
            g = self.groups.get(name)
            if g is None:
                continue
            expired = expire_tracks(g.tracks, now_ms, retention)
            if not g.members and len(expired) == len(g.tracks):
                records += group_tombstones(g.group_id, set(g.members) | set(g.targets) | set(g.current))
                gone.append(name)
            elif not expired:
                continue  # nothing due after all: the next replay of the group sets its deadline
            elif gone:
                self.deadlines.set(name, self._retention_due(g))  # a write of its own, next call
            else:
                kept = [e for e in g.tracks.values() if e not in expired]
                record = new_group_metadata_record(
                    g.group_id, g.group_epoch, g.assignment_epoch, kept, g.created_ms
                )
                outcome = TickOutcome(
                    expired_tracks=tuple((g.group_id, e.topic, e.filter, e.track) for e in expired)
                )
                return Result(outcome, (record,))
        if gone:
            return Result(TickOutcome(expired_groups=tuple(gone)), tuple(records))
        return None

    # ---- target assignments computed off the event loop (assignment.py) -------------------------

    def _assignment_due(self, g: Group, now_ms: int) -> bool:
        soft = self.soft.group(g.group_id)
        return (
            bool(g.members)
            and g.assignment_epoch < g.group_epoch
            and soft.assigning_epoch is None
            and (
                soft.last_assignment_ms is None
                or now_ms - soft.last_assignment_ms >= self.settings.assignment_interval_ms
            )
        )

    def _assignment_job(self, g: Group) -> AssignmentJob:
        members = dict(g.members)
        self.soft.group(g.group_id).assigning_epoch = g.group_epoch
        return AssignmentJob(
            group=g.group_id,
            group_epoch=g.group_epoch,
            members=members,
            tracks=dict(g.tracks),
            current=dict(g.targets),
            assignor=choose_assignor(g.config, members),
            partitions=self._partitions(members.values()),
            metadata_version=self.topics.metadata_version,
            topics=self._snapshot(members.values()),
        )

    def assignment_jobs(self, now_ms: int) -> list[AssignmentJob]:
        """Snapshots of the groups whose target is due (throttled to one per ``assignment_interval_ms``
        after the previous one was applied, one in flight per group). The caller computes each one
        (``job.compute()``, in a worker thread) and applies it with :meth:`apply_assignment`, or gives it
        up with :meth:`abandon_assignment`."""
        due = [self.groups[name] for name in self.live if name in self.groups]
        return [self._assignment_job(g) for g in due if self._assignment_due(g, now_ms)]

    def abandon_assignment(self, job: AssignmentJob) -> None:
        self.soft.group(job.group).assigning_epoch = None

    def apply_assignment(
        self, job: AssignmentJob, targets: Mapping[str, frozenset[Slot]], now_ms: int
    ) -> Result[TickOutcome]:
        """Write ``targets`` (computed from ``job``) as the group's target at the job's group epoch.

        Changes since the snapshot wait for the next job: a member that left gets no target, one whose
        record changed keeps its previous target, slots of retired tracks are dropped. A group assigned
        at that epoch or later meanwhile (inline) ignores the result.
        """
        g = self.groups.get(job.group)
        soft = self.soft.group(job.group)
        soft.assigning_epoch = None
        if g is None or not g.members or g.assignment_epoch >= job.group_epoch:
            return Result(TickOutcome())
        live_tracks = {DEFAULT_TRACK} | {e.track for e in g.tracks.values()}
        records: list[Record] = []
        for mid in sorted(targets):
            if g.members.get(mid) != job.members.get(mid):
                continue
            slots = targets[mid]
            if any(track not in live_tracks for track, _, _ in slots):
                slots = frozenset(s for s in slots if s[0] in live_tracks)
            if mid not in g.targets or g.targets[mid] != slots:
                records.append(new_target_record(g.group_id, mid, slots))
        records.append(
            new_group_metadata_record(
                g.group_id, g.group_epoch, job.group_epoch, g.tracks.values(), g.created_ms
            )
        )
        soft.last_assignment_ms = now_ms
        soft.metadata_version = job.metadata_version
        soft.topics = job.topics
        return Result(TickOutcome(assigned_groups=(g.group_id,)), tuple(records))

    def _overdue(self, g: Group, now_ms: int) -> list[tuple[str, str]]:
        """Members past their session timeout or rebalance deadline. Reads only the members silent for
        longer than the group's shortest session timeout (the soft state keeps them first) and those with
        partitions pending revocation, so a sweep of a big healthy group costs next to nothing."""
        group = g.group_id
        if self.soft.tracked(group) < len(g.members):
            for mid in g.members:  # recovered at start (or after a reload): sessions start now
                self.soft.member(group, mid, now_ms)
        removed = []
        for mid, soft in self.soft.silent_since(group, now_ms - self._min_session_timeout(g)):
            member = g.members.get(mid)
            if member is None:
                self.soft.forget(group, mid)  # removed by a record the soft state missed
            elif now_ms - soft.last_seen_ms > self._session_timeout(g, member):
                removed.append((mid, "session_timeout"))
        expired = {mid for mid, _ in removed}
        for mid in sorted(g.revoking - expired):
            member = g.members.get(mid)
            if member is None:
                continue
            soft = self.soft.member(group, mid, now_ms)
            if soft.revoke_deadline_ms is None:
                soft.revoke_deadline_ms = now_ms + self._rebalance_timeout(g, member)
            elif now_ms > soft.revoke_deadline_ms:
                removed.append((mid, "rebalance_timeout"))
        return removed

    def _min_session_timeout(self, g: Group) -> int:
        """The shortest session timeout among the group's members; cached until the membership or the
        config changes (every member change moves the group epoch)."""
        soft = self.soft.group(g.group_id)
        key = (g.group_epoch, g.config)
        if soft.min_session_timeout is None or soft.min_session_timeout[0] != key:
            default = g.settings_for(self.settings)[1]
            shortest = min((m.session_timeout_ms or default for m in g.members.values()), default=default)
            soft.min_session_timeout = (key, shortest)
        return soft.min_session_timeout[1]
