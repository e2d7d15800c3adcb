"""The consumer-group state machine (KIP-848 model). Pure: no I/O, no clock (time is passed in).

Handlers (``heartbeat``, ``leave``, ``set_config``, ``tick``) validate, decide, and return a
:class:`Result` of a response plus the records to persist; only :meth:`GroupsState.replay` changes durable
state. Soft state (sessions, deadlines, caches: ``sessions.py``) is touched by handlers directly.

Epochs (KIP-848):

- the **group epoch** moves on every change of membership, subscriptions, or subscribed topics;
- the **assignment epoch** is the group epoch the target assignment was computed at. Computing it runs the
  assignor, so it happens at most once per ``assignment_interval_ms`` (a join storm is batched);
- a **member epoch** moves to the assignment epoch when the member has released everything its new target
  takes away (``reconcile.py``). A heartbeat must carry the member's current epoch: a future one or an old
  one is FENCED_MEMBER_EPOCH, except the previous epoch with nothing new claimed (the answer carrying the
  new epoch was lost), which is answered again.

A heartbeat that changes nothing returns no records: liveness is soft, so steady heartbeats cost Redis
nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sluice.codec.filter import parse_filter
from sluice.common.names import validate_group, validate_topic
from sluice.coordinator.assignors import get_assignor
from sluice.coordinator.cluster.records import TopicRecord
from sluice.coordinator.groups.assignment import AssignmentJob, Overlay
from sluice.coordinator.groups.group import Group
from sluice.coordinator.groups.model import (
    DEFAULT_TRACK,
    JOIN_EPOCH,
    LEAVE_EPOCH,
    MAX_TIMEOUT_MS,
    MIN_TIMEOUT_MS,
    STATIC_LEAVE_EPOCH,
    AssignedPartition,
    GroupConfig,
    GroupDescription,
    GroupSettings,
    GroupSummary,
    HeartbeatRequest,
    HeartbeatResponse,
    MemberDescription,
    MessageModel,
    Slot,
    TickOutcome,
    TopicPartition,
    TrackBinding,
)
from sluice.coordinator.groups.reconcile import MemberState, Reconciled, reconcile
from sluice.coordinator.groups.records import (
    GROUP_RECORD_TYPES,
    CurrentAssignmentRecord,
    GroupConfigRecord,
    GroupMetadataRecord,
    MemberRecord,
    TargetAssignmentRecord,
    TrackEntry,
    new_current_record,
    new_group_config_record,
    new_group_metadata_record,
    new_member_record,
    new_member_tombstones,
    new_target_record,
)
from sluice.coordinator.groups.sessions import GroupSoftState, MemberSoft
from sluice.coordinator.groups.targets import choose_assignor, compute_targets
from sluice.coordinator.groups.tracks import expire_tracks, plan_tracks, split_conflicts
from sluice.coordinator.records import Record, RecordValue, Result, Tombstone
from sluice.errors import (
    FencedMemberEpoch,
    InconsistentSubscription,
    InvalidArgument,
    InvalidFilter,
    InvalidRequest,
    UnknownAssignor,
    UnknownGroup,
    UnknownMember,
    UnknownTopicOrPartition,
)

__all__ = ["GroupsState", "NudgeBasis", "TopicSource"]

_STABLE = MemberState.STABLE.value

# Refusals answered in the heartbeat response's ``error`` (the member acts on them); anything else raised
# by a handler (a malformed request) fails the RPC.
_PROTOCOL_ERRORS = (
    FencedMemberEpoch,
    InconsistentSubscription,
    InvalidFilter,
    UnknownAssignor,
    UnknownMember,
    UnknownTopicOrPartition,
)


class TopicSource(Protocol):
    """What groups need of the cluster state: the topics and a version that moves when they change."""

    @property
    def metadata_version(self) -> int: ...

    @property
    def topics(self) -> Mapping[str, TopicRecord]: ...


@dataclass
class _Change:
    """A membership change being planned inside one handler (nothing is applied until replay)."""

    group: Group
    members: Mapping[str, MemberRecord]
    tracks: dict[tuple[str, str], TrackEntry]
    targets: Mapping[str, frozenset[Slot]]
    group_epoch: int
    assignment_epoch: int
    config: GroupConfig
    removed: set[str] = field(default_factory=set)
    records: list[Record] = field(default_factory=list)


@dataclass(frozen=True)
class NudgeBasis:
    """The state :meth:`GroupsState.members_to_nudge` compares with, taken before a write's replay."""

    #: Touched group -> its assignment epoch.
    assignment_epochs: Mapping[str, int]
    #: Group -> slots the write takes from their owners (released, revoked, or the owner removed).
    freed: Mapping[str, set[Slot]]


class GroupsState:
    """Every consumer group: durable (rebuilt by replay) plus soft liveness."""

    RECORD_TYPES: tuple[type[RecordValue], ...] = GROUP_RECORD_TYPES

    def __init__(
        self, topics: TopicSource, settings: GroupSettings | None = None, soft: GroupSoftState | None = None
    ) -> None:
        self.settings = settings or GroupSettings()
        self.topics = topics
        self.groups: dict[str, Group] = {}
        self.soft = soft or GroupSoftState()

    # ---- replay: the only mutation of durable state ---------------------------------------------

    def replay(self, record: Record) -> None:
        if isinstance(record, Tombstone):
            if record.type in (GroupConfigRecord.TYPE, GroupMetadataRecord.TYPE):
                self.groups.pop(record.id, None)
                return
            group_id, _, member_id = record.id.partition("/")
            g = self.groups.get(group_id)
            if g is None:
                return
            if record.type == CurrentAssignmentRecord.TYPE:
                g.remove_current(member_id)
            elif record.type == TargetAssignmentRecord.TYPE:
                g.remove_target(member_id)
            elif record.type == MemberRecord.TYPE:
                g.remove_member(member_id)
            else:
                raise ValueError(f"group state cannot replay a tombstone of type {record.type!r}")
            return
        if isinstance(record, GroupConfigRecord):
            self._group(record.group).replay_config(record)
        elif isinstance(record, GroupMetadataRecord):
            self._group(record.group).replay_metadata(record)
        elif isinstance(record, MemberRecord):
            self._group(record.group).replay_member(record)
        elif isinstance(record, TargetAssignmentRecord):
            self._group(record.group).replay_target(record)
        elif isinstance(record, CurrentAssignmentRecord):
            self._group(record.group).replay_current(record)
        else:
            raise ValueError(f"group state cannot replay {type(record).__name__}")

    def _group(self, group_id: str) -> Group:
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = Group(group_id)
        return g

    # ---- heartbeat ------------------------------------------------------------------------------

    def heartbeat(self, req: HeartbeatRequest, now_ms: int, new_member_id: str) -> Result[HeartbeatResponse]:
        """One member heartbeat: join (epoch 0), leave (-1), static leave (-2) or a regular heartbeat.

        ``new_member_id`` is the id a joining member gets (chosen by the caller, so this stays
        deterministic). Protocol refusals come back in ``response.error``; malformed input raises.
        """
        validate_group(req.group)
        if req.member_epoch < STATIC_LEAVE_EPOCH:
            raise InvalidRequest(
                f"member_epoch {req.member_epoch} is invalid: use 0 to join, -1 to leave, -2 for a static "
                "member's temporary leave, or the epoch the last heartbeat returned"
            )
        for name in ("rebalance_timeout_ms", "session_timeout_ms"):
            value = getattr(req, name)
            if value != 0 and not MIN_TIMEOUT_MS <= value <= MAX_TIMEOUT_MS:
                raise InvalidArgument(
                    f"{name}={value} is outside {MIN_TIMEOUT_MS}..{MAX_TIMEOUT_MS} (0 = default)"
                )
        for topic, partition in req.owned:
            if partition < 0:
                raise InvalidArgument(f"owned partition {topic}/{partition} is negative")
        try:
            if req.member_epoch == LEAVE_EPOCH:
                return self._leave(req.group, req.member_id, None, now_ms, static=False)
            if req.member_epoch == STATIC_LEAVE_EPOCH:
                return self._leave(req.group, req.member_id, None, now_ms, static=True)
            if req.member_epoch == JOIN_EPOCH:
                return self._join(req, now_ms, new_member_id)
            return self._heartbeat(req, now_ms)
        except _PROTOCOL_ERRORS as err:
            return Result(
                HeartbeatResponse(member_id=req.member_id, member_epoch=req.member_epoch, error=err)
            )

    def _join(self, req: HeartbeatRequest, now_ms: int, new_member_id: str) -> Result[HeartbeatResponse]:
        g = self.groups.get(req.group) or Group(req.group, now_ms)
        if req.instance_id and req.instance_id in g.by_instance:
            # Static membership: the restarted instance takes over its member id and partitions.
            member_id = g.by_instance[req.instance_id]
        elif req.member_id:
            if req.member_id not in g.members:
                raise UnknownMember(
                    f"member {req.member_id} is not in group {req.group!r} (it left, timed out or was "
                    "fenced): join again with an empty member_id"
                )
            member_id = req.member_id
        else:
            member_id = new_member_id
        record = self._member_record(g, member_id, req, req.instance_id)
        # Re-joining an existing member id always gets a new member epoch, so commits of the previous
        # incarnation (a zombie) are refused by the offset store.
        existing = member_id in g.members
        change = self._plan(g, now_ms, record, (), force=existing)
        return self._answer(g, change, member_id, req, now_ms, joined=True)

    def _heartbeat(self, req: HeartbeatRequest, now_ms: int) -> Result[HeartbeatResponse]:
        g = self.groups.get(req.group)
        if g is None or req.member_id not in g.members:
            raise UnknownMember(
                f"member {req.member_id!r} is not in group {req.group!r} (it left, timed out or was fenced): "
                "release every partition and join again with member_epoch 0 and an empty member_id"
            )
        cur = g.reconciled(req.member_id)
        if req.member_epoch != cur.member_epoch:
            lost_answer = req.member_epoch == cur.previous_member_epoch and req.owned <= g.owned_tps.get(
                req.member_id, frozenset()
            )
            if not lost_answer:
                relation = "newer than" if req.member_epoch > cur.member_epoch else "older than"
                raise FencedMemberEpoch(
                    f"member {req.member_id} of group {req.group!r} sent epoch {req.member_epoch}, "
                    f"{relation} its current epoch {cur.member_epoch}: it was fenced. Release every "
                    "partition without committing and join again with member_epoch 0"
                )
        soft = self.soft.touch(req.group, req.member_id, now_ms)
        soft.away = False
        fingerprint = _fingerprint(req)
        change = None
        if soft.fingerprint != fingerprint:
            # The instance id is fixed at join (a static member's identity); later heartbeats cannot move it.
            record = self._member_record(g, req.member_id, req, g.members[req.member_id].instance_id)
            if record != g.members[req.member_id]:
                change = self._plan(g, now_ms, record, (), force=False)
            else:
                soft.fingerprint = fingerprint
        if change is None:
            # The steady state: nothing is copied, the group's own tables are read.
            change = _Change(g, g.members, g.tracks, g.targets, g.group_epoch, g.assignment_epoch, g.config)
        return self._answer(g, change, req.member_id, req, now_ms, joined=False, fingerprint=fingerprint)

    def _member_record(
        self, g: Group, member_id: str, req: HeartbeatRequest, instance_id: str
    ) -> MemberRecord:
        """Validate and normalise what the member asks for."""
        if not req.subscription:
            raise InvalidArgument(
                "the subscription is empty: subscribe to at least one topic, or leave with member_epoch -1"
            )
        subscription = {}
        for topic in sorted(req.subscription):
            validate_topic(topic)
            if topic not in self.topics.topics:
                raise UnknownTopicOrPartition(
                    f"group {req.group!r}: the subscription names topic {topic!r}, which does not exist",
                    topic=topic,
                )
            subscription[topic] = parse_filter(req.subscription[topic]).expression
        if req.assignor:
            get_assignor(req.assignor)
        for other in g.members.values():
            if other.member_id != member_id and other.message_model is not req.message_model:
                raise InconsistentSubscription(
                    f"group {req.group!r} consumes with message model {other.message_model.value} (member "
                    f"{other.member_id}); member asks for {req.message_model.value}. Use another group"
                )
        return new_member_record(
            g.group_id,
            member_id,
            instance_id=instance_id,
            client_id=req.client_id,
            subscription=subscription,
            assignor=req.assignor,
            message_model=req.message_model,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            session_timeout_ms=req.session_timeout_ms,
        )

    # ---- planning a membership change -----------------------------------------------------------

    def _plan(
        self,
        g: Group,
        now_ms: int,
        upsert: MemberRecord | None,
        remove: Iterable[str],
        *,
        force: bool,
        config: GroupConfig | None = None,
    ) -> _Change:
        """Bump the group epoch for a membership/subscription change and, unless throttled, compute the
        new target assignment. Raises InconsistentSubscription under the ``reject`` policy."""
        removed = set(remove)
        config = config or g.config
        excluded = removed | ({upsert.member_id} if upsert is not None else set())
        previous = g.members.get(upsert.member_id) if upsert is not None else None
        tracks, conflict = plan_tracks(
            g.tracks,
            g.holders,
            excluded,
            config.conflict_policy,
            upsert.subscription if upsert is not None else None,
            previous.subscription if previous is not None else None,
            now_ms,
        )
        if upsert is not None and conflict is not None:
            message = conflict.message(g.group_id, upsert.member_id)
            self.soft.group(g.group_id).rejections.append(message)
            raise InconsistentSubscription(
                message,
                topic=conflict.topic,
                expression=conflict.expression,
                other_expression=conflict.other_expression,
                other_member=conflict.other_member,
            )
        # Views, not copies: a join into a group of thousands of members costs O(1) here.
        members = Overlay(g.members, removed, (upsert.member_id, upsert) if upsert is not None else None)
        change = _Change(
            g,
            members,
            tracks,
            Overlay(g.targets, removed),
            g.group_epoch + 1,
            g.assignment_epoch,
            config,
            removed,
        )
        for mid in sorted(removed):
            change.records.extend(new_member_tombstones(g.group_id, mid))
        if upsert is not None:
            change.records.append(upsert)
        small = len(members) < self.settings.assignment_batch_min_members
        rejoin = force and previous is not None
        if small or g.assignment_epoch == 0:
            self._assign(change, now_ms)
        elif (
            rejoin
            and not removed
            and upsert == previous
            and config == g.config
            and g.assignment_epoch == g.group_epoch
        ):
            # Same members, subscriptions and config: the (deterministic) assignor would return the
            # current target, so only the epoch moves - the re-joined member gets a new epoch, fencing its
            # previous incarnation, without an assignor run.
            change.assignment_epoch = change.group_epoch
        elif rejoin:
            self._assign(change, now_ms)  # rare; the new incarnation must get a new epoch now
        # Otherwise a big group's target is computed by the timer, off the event loop (assignment.py).
        # The group record goes first, so a brand-new group exists before its members replay.
        change.records.insert(
            0,
            new_group_metadata_record(
                g.group_id,
                change.group_epoch,
                change.assignment_epoch,
                tracks.values(),
                g.created_ms or now_ms,
            ),
        )
        return change

    def _assign(self, change: _Change, now_ms: int) -> None:
        partitions = self._partitions(change.members.values())
        targets = compute_targets(
            change.members,
            change.tracks,
            change.targets,
            choose_assignor(change.config, change.members),
            partitions,
        )
        for mid in sorted(targets):
            if change.targets.get(mid) != targets[mid] or mid not in change.group.targets:
                change.records.append(new_target_record(change.group.group_id, mid, targets[mid]))
        change.targets = targets
        change.assignment_epoch = change.group_epoch
        soft = self.soft.group(change.group.group_id)
        soft.last_assignment_ms = now_ms
        soft.metadata_version = self.topics.metadata_version
        soft.topics = self._snapshot(change.members.values())

    def _partitions(self, members: Iterable[MemberRecord]) -> dict[str, int]:
        known = self.topics.topics
        wanted = {t for m in members for t in m.subscription}
        return {t: known[t].partitions for t in sorted(wanted) if t in known}

    def _snapshot(self, members: Iterable[MemberRecord]) -> dict[str, tuple[str, int]]:
        known = self.topics.topics
        wanted = {t for m in members for t in m.subscription}
        return {t: (known[t].topic_id, known[t].partitions) for t in sorted(wanted) if t in known}

    # ---- reconciling the heartbeating member ----------------------------------------------------

    def _answer(
        self,
        g: Group,
        change: _Change,
        member_id: str,
        req: HeartbeatRequest,
        now_ms: int,
        *,
        joined: bool,
        fingerprint: tuple[object, ...] | None = None,
    ) -> Result[HeartbeatResponse]:
        before = g.reconciled(member_id) if member_id in g.current else None
        after = self._reconcile(g, change, member_id, req, before)
        records = change.records
        if after != before:
            records.append(
                new_current_record(
                    g.group_id,
                    member_id,
                    after.member_epoch,
                    after.previous_member_epoch,
                    after.state.value,
                    after.assigned,
                    after.pending,
                )
            )
        response = self._respond(
            g, change, member_id, req, now_ms, after, joined, fingerprint or _fingerprint(req)
        )
        return Result(response, tuple(records))

    def quick_heartbeat(self, req: HeartbeatRequest, now_ms: int) -> HeartbeatResponse | None:
        """The answer to a regular heartbeat that changes nothing durable, or None when it may change
        something (the caller then runs :meth:`heartbeat` under the write lock).

        Touches soft state only when it answers. Caller: the service, *without* the write lock: the
        answer is the one :meth:`heartbeat` would give on the current state and it writes nothing, so it
        is as if it ran just before any write still in flight. The checks are the ones
        :meth:`_heartbeat` makes: an unchanged fingerprint means the subscription, model and timeouts
        were validated when it was stored, and an unchanged reconciliation means no record.
        """
        if req.member_epoch <= 0:
            return None
        g = self.groups.get(req.group)
        record = g.current.get(req.member_id) if g is not None else None
        if g is None or record is None or req.member_epoch != record.member_epoch:
            return None
        soft = self.soft.members.get((req.group, req.member_id))
        if soft is None or soft.fingerprint is None or soft.fingerprint != _fingerprint(req):
            return None
        owned = g.owned_tps[req.member_id]
        if owned != req.owned:
            for _, partition in req.owned:
                if partition < 0:
                    return None  # the full path refuses it
        if (
            record.state == _STABLE
            and not record.pending
            and record.member_epoch == g.assignment_epoch
            and g.message_model_of(req.member_id) is MessageModel.CLUSTERING
        ):
            # The steady state (most heartbeats): reconcile() would return the member unchanged.
            return self._steady_answer(g, req, now_ms, soft, owned)
        cur = g.reconciled(req.member_id)
        change = _Change(g, g.members, g.tracks, g.targets, g.group_epoch, g.assignment_epoch, g.config)
        after = self._reconcile(g, change, req.member_id, req, cur)
        if after != cur:
            return None
        return self._respond(g, change, req.member_id, req, now_ms, after, False, soft.fingerprint)

    def _steady_answer(
        self, g: Group, req: HeartbeatRequest, now_ms: int, soft: MemberSoft, owned: frozenset[TopicPartition]
    ) -> HeartbeatResponse:
        """:meth:`_respond` for a member that holds exactly its target at the assignment epoch (nothing
        pending, so ``owned`` is what it is assigned)."""
        mid = req.member_id
        self.soft.touch(g.group_id, mid, now_ms)
        soft.away = False
        soft.revoke_deadline_ms = None
        assignment = None
        if owned != req.owned:
            subscription = g.members[mid].subscription
            assignment = tuple(
                sorted(
                    AssignedPartition(t, p, tr, subscription.get(t, "*"))
                    for tr, t, p in g.current[mid].assigned
                )
            )
        interval = g.settings_for(self.settings)[0]
        if g.assignment_epoch < g.group_epoch and (
            len(g.members) < self.settings.assignment_batch_min_members or mid not in g.targets
        ):
            interval = min(interval, self.settings.reconcile_heartbeat_interval_ms)
        return HeartbeatResponse(mid, g.assignment_epoch, interval, assignment)

    def _reconcile(
        self, g: Group, change: _Change, member_id: str, req: HeartbeatRequest, before: Reconciled | None
    ) -> Reconciled:
        current = before or Reconciled(0, -1, MemberState.STABLE, frozenset(), frozenset())
        exclusive = change.members[member_id].message_model is MessageModel.CLUSTERING
        owner = g.owner
        removed = change.removed

        def is_free(slot: Slot) -> bool:
            holder = owner.get(slot)
            return holder is None or holder == member_id or holder in removed

        return reconcile(
            current,
            change.assignment_epoch,
            change.targets.get(member_id, frozenset()),
            req.owned,
            is_free,
            exclusive,
        )

    def _respond(
        self,
        g: Group,
        change: _Change,
        member_id: str,
        req: HeartbeatRequest,
        now_ms: int,
        after: Reconciled,
        joined: bool,
        fingerprint: tuple[object, ...],
    ) -> HeartbeatResponse:
        """The answer for ``after``, and the member's soft state (liveness, fingerprint, deadline)."""
        soft = self.soft.touch(g.group_id, member_id, now_ms)
        soft.away = False
        soft.fingerprint = fingerprint
        if after.pending:
            if soft.revoke_deadline_ms is None:
                soft.revoke_deadline_ms = now_ms + self._rebalance_timeout(g, change.members[member_id])
        else:
            soft.revoke_deadline_ms = None
        assigned_tps = frozenset((t, p) for _, t, p in after.assigned)
        send = joined or assigned_tps != req.owned or change.members[member_id] != g.members.get(member_id)
        assignment = None
        if send:
            subscription = change.members[member_id].subscription
            assignment = tuple(
                sorted(AssignedPartition(t, p, tr, subscription.get(t, "*")) for tr, t, p in after.assigned)
            )
        interval = g.settings_for(self.settings)[0]
        if after.state is not MemberState.STABLE or (
            change.assignment_epoch < change.group_epoch
            and (
                len(change.members) < self.settings.assignment_batch_min_members
                or member_id not in change.targets
            )
        ):
            # Hurry while this member has something to hand over or to receive. While a big group's
            # target is being computed only its newcomers hurry: thousands of members heartbeating at
            # the short interval through a join storm would multiply the coordinator's load by ten.
            interval = min(interval, self.settings.reconcile_heartbeat_interval_ms)
        return HeartbeatResponse(member_id, after.member_epoch, interval, assignment)

    def _rebalance_timeout(self, g: Group, member: MemberRecord) -> int:
        """How long the member may hold a revoked partition: its own ``rebalance_timeout_ms``, bounded by
        the group's when SetGroupConfig set one (the group's operator decides how long one stuck member
        may hold up everyone's rebalance; a member may still ask for less). Without a group setting:
        the member's, else the coordinator default."""
        asked = member.rebalance_timeout_ms
        imposed = g.config.rebalance_timeout_ms
        if imposed:
            return min(asked, imposed) if asked else imposed
        return asked or self.settings.rebalance_timeout_ms

    def _session_timeout(self, g: Group, member: MemberRecord) -> int:
        return member.session_timeout_ms or g.settings_for(self.settings)[1]

    # ---- leaving --------------------------------------------------------------------------------

    def leave(self, group: str, member_id: str, member_epoch: int, now_ms: int) -> Result[None]:
        """LeaveGroup: ``member_epoch`` -2 is a static member's temporary leave; -1 (or the member's
        current epoch) leaves for good. Errors raise (the response has no error field)."""
        validate_group(group)
        result = self._leave(
            group,
            member_id,
            member_epoch if member_epoch > 0 else None,
            now_ms,
            static=member_epoch == STATIC_LEAVE_EPOCH,
        )
        return Result(None, result.records)

    def _leave(
        self, group: str, member_id: str, epoch: int | None, now_ms: int, *, static: bool
    ) -> Result[HeartbeatResponse]:
        g = self.groups.get(group)
        if g is None or not g.exists:
            raise UnknownGroup(f"group {group!r} does not exist")
        if member_id not in g.members:
            raise UnknownMember(f"member {member_id!r} is not in group {group!r} (already left or timed out)")
        cur = g.reconciled(member_id)
        if epoch is not None and epoch not in (cur.member_epoch, cur.previous_member_epoch):
            raise FencedMemberEpoch(
                f"member {member_id} of group {group!r} left with epoch {epoch}, but its epoch is "
                f"{cur.member_epoch}: a fenced incarnation cannot remove the current one"
            )
        if static:
            if not g.members[member_id].instance_id:
                raise InvalidRequest(
                    f"member {member_id} has no instance_id: member_epoch -2 is for static members; "
                    "leave with -1"
                )
            # Keep its partitions until it comes back or its session expires.
            self.soft.touch(group, member_id, now_ms).away = True
            return Result(HeartbeatResponse(member_id, STATIC_LEAVE_EPOCH, 0))
        change = self._plan(g, now_ms, None, (member_id,), force=False)
        self.soft.forget(group, member_id)
        return Result(HeartbeatResponse(member_id, LEAVE_EPOCH, 0), tuple(change.records))

    # ---- configuration --------------------------------------------------------------------------

    def set_config(
        self, group: str, update: GroupConfig, policy_given: bool, now_ms: int
    ) -> Result[GroupConfig]:
        """SetGroupConfig: given fields replace, the others stay. Creates the group if needed, so a policy
        can be set before anyone joins. A new assignor recomputes the target at once."""
        validate_group(group)
        update.validate()
        if update.assignor:
            get_assignor(update.assignor)
        g = self.groups.get(group) or Group(group, now_ms)
        merged = g.config.merged(update, policy_given).validate()
        records: list[Record] = []
        if merged != g.config:
            records.append(new_group_config_record(group, merged))
        if not g.exists:
            records.append(new_group_metadata_record(group, 0, 0, (), now_ms))
        elif g.members and choose_assignor(merged, g.members) != choose_assignor(g.config, g.members):
            records.extend(self._plan(g, now_ms, None, (), force=True, config=merged).records)
        return Result(merged, tuple(records))

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
        retention = self.settings.offsets_retention_ms
        for g in self.groups.values():
            if sweep and retention and g.earliest_idle_ms and now_ms - g.earliest_idle_ms >= retention:
                expired = expire_tracks(g.tracks, now_ms, retention)
                kept = [e for e in g.tracks.values() if e not in expired]
                record = new_group_metadata_record(
                    g.group_id, g.group_epoch, g.assignment_epoch, kept, g.created_ms
                )
                return Result(
                    TickOutcome(
                        expired_tracks=tuple((g.group_id, e.topic, e.filter, e.track) for e in expired)
                    ),
                    (record,),
                )
            if not g.members:
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
        return [self._assignment_job(g) for g in self.groups.values() if self._assignment_due(g, now_ms)]

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

    # ---- reads ----------------------------------------------------------------------------------

    def list_groups(self) -> list[GroupSummary]:
        return [
            GroupSummary(name, g.state(), len(g.members))
            for name, g in sorted(self.groups.items())
            if g.exists
        ]

    def describe(self, group: str) -> GroupDescription:
        validate_group(group)
        g = self.groups.get(group)
        if g is None or not g.exists:
            raise UnknownGroup(f"group {group!r} does not exist")
        members = []
        for mid in sorted(g.members):
            m = g.members[mid]
            cur = g.current.get(mid)

            def describe_slots(slots: Iterable[Slot], m: MemberRecord = m) -> tuple[AssignedPartition, ...]:
                return tuple(
                    sorted(AssignedPartition(t, p, tr, m.subscription.get(t, "*")) for tr, t, p in slots)
                )

            members.append(
                MemberDescription(
                    mid,
                    m.instance_id,
                    m.client_id,
                    cur.member_epoch if cur else 0,
                    dict(m.subscription),
                    describe_slots(cur.assigned if cur else ()),
                    describe_slots(cur.pending if cur else ()),
                    m.message_model,
                    cur.state if cur else MemberState.STABLE.value,
                )
            )
        soft = self.soft.group(group)
        return GroupDescription(
            group=group,
            state=g.state(),
            group_epoch=g.group_epoch,
            config=g.config,
            members=tuple(members),
            conflicts=tuple(split_conflicts(g)) + tuple(soft.rejections),
            tracks=tuple(g.active_tracks()),
            track_entries=tuple(sorted((e.topic, e.filter, e.track) for e in g.tracks.values())),
            message_model=g.message_model,
            owners=dict(g.owner),
            topics=self._partitions(g.members.values()),
            bindings=tuple(
                TrackBinding(
                    e.topic,
                    e.filter,
                    e.track,
                    len(g.holders.get(e.topic, {}).get(e.filter, ())),
                    e.idle_since_ms,
                    e.source,
                    e.inherited_filter,
                    e.since_ms,
                )
                for e in sorted(g.tracks.values())
            ),
        )

    def lag_view(self, group: str) -> GroupDescription:
        """What the lag refresh needs of a group, cheaply: DescribeGroup's shape without per-member
        detail for a clustering group (its partitions are all covered by ``track_entries`` x ``topics``),
        so refreshing the lag of a group of thousands of members builds no per-member objects."""
        validate_group(group)
        g = self.groups.get(group)
        if g is None or not g.exists:
            raise UnknownGroup(f"group {group!r} does not exist")
        if g.message_model is MessageModel.BROADCASTING:
            return self.describe(group)
        return GroupDescription(
            group=group,
            state=g.state(),
            group_epoch=g.group_epoch,
            config=g.config,
            members=(),
            conflicts=(),
            tracks=tuple(g.active_tracks()),
            track_entries=tuple(sorted((e.topic, e.filter, e.track) for e in g.tracks.values())),
            message_model=g.message_model,
            owners=dict(g.owner),
            topics=self._partitions(g.members.values()),
        )

    def nudge_basis(self, records: Iterable[Record], groups: Iterable[str]) -> NudgeBasis:
        """What :meth:`members_to_nudge` compares with, read *before* ``records`` are replayed: each
        touched group's assignment epoch, and the slots the records take from their owners."""
        epochs = {}
        for name in groups:
            g = self.groups.get(name)
            epochs[name] = g.assignment_epoch if g is not None else 0
        freed: dict[str, set[Slot]] = {}
        for r in records:
            if isinstance(r, CurrentAssignmentRecord):
                group_id, member_id, now_owned = r.group, r.member_id, r.owned
            elif isinstance(r, Tombstone) and r.type == CurrentAssignmentRecord.TYPE:
                group_id, _, member_id = r.id.partition("/")
                now_owned = frozenset()
            else:
                continue
            g = self.groups.get(group_id)
            old = g.current.get(member_id) if g is not None else None
            if old is not None and not old.owned <= now_owned:
                freed.setdefault(group_id, set()).update(old.owned - now_owned)
        return NudgeBasis(epochs, freed)

    def members_to_nudge(self, records: Iterable[Record], basis: NudgeBasis) -> list[tuple[str, str]]:
        """After ``records`` were replayed: the (group, member)s that can make progress only by
        heartbeating, so a streaming member is told to heartbeat now instead of at its next interval.

        - a member whose target changed (it has partitions to release or to take); in a big group only
          once its target has caught up with its membership (a join storm moves targets every
          assignment interval: members acting on each intermediate one would multiply the writes, so
          meanwhile they heartbeat at their interval, as with unary heartbeats);
        - a member waiting for partitions (UNRELEASED_PARTITIONS) one of which the write freed;
        - a removed member (fenced, expired): it learns at once that it must rejoin;
        - when a small group's assignment epoch moved, every member not at it yet (the group is
          reconciling until each has heartbeated). Big groups' members with an unchanged target move
          their epoch at their regular heartbeat: telling thousands at once would be a heartbeat storm.
        """
        out: dict[str, set[str]] = {}
        settled: dict[str, bool] = {}
        for r in records:
            if isinstance(r, TargetAssignmentRecord):
                if r.group not in settled:
                    g = self.groups.get(r.group)
                    settled[r.group] = g is not None and (
                        len(g.members) < self.settings.assignment_batch_min_members
                        or g.assignment_epoch == g.group_epoch
                    )
                if settled[r.group]:
                    out.setdefault(r.group, set()).add(r.member_id)
            elif isinstance(r, Tombstone) and r.type == MemberRecord.TYPE:
                group_id, _, member_id = r.id.partition("/")
                out.setdefault(group_id, set()).add(member_id)
        for group_id, slots in basis.freed.items():
            g = self.groups.get(group_id)
            if g is None or not g.waiting:
                continue
            for slot in slots:
                mid = g.target_owner.get(slot)
                if mid is not None and mid in g.waiting:
                    out.setdefault(group_id, set()).add(mid)
        for group_id, before in basis.assignment_epochs.items():
            g = self.groups.get(group_id)
            if (
                g is not None
                and g.assignment_epoch != before
                and len(g.members) < self.settings.assignment_batch_min_members
            ):
                epoch = g.assignment_epoch
                behind = {mid for mid, cur in g.current.items() if cur.member_epoch != epoch}
                out.setdefault(group_id, set()).update(behind)
        return [(group_id, mid) for group_id in sorted(out) for mid in sorted(out[group_id])]

    def touched_groups(self, records: Iterable[Record]) -> set[str]:
        """Groups that ``records`` change (for metrics after a write)."""
        out = set()
        for r in records:
            if isinstance(r, Tombstone):
                if r.type in {t.TYPE for t in GROUP_RECORD_TYPES}:
                    out.add(r.id.partition("/")[0])
            elif isinstance(r, GROUP_RECORD_TYPES):
                out.add(r.group)  # type: ignore[attr-defined]
        return out


def _fingerprint(req: HeartbeatRequest) -> tuple[object, ...]:
    return (
        req.client_id,
        tuple(sorted(req.subscription.items())),
        req.assignor,
        req.message_model,
        req.rebalance_timeout_ms,
        req.session_timeout_ms,
    )
