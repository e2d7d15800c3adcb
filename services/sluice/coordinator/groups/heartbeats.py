"""Heartbeats, joins and leaves of consumer-group members (KIP-848), and reconciling the answer.

A handler validates the request, plans the change (``planning.py``), reconciles the heartbeating member
(``reconcile.py``) and returns the records; ``GroupsState.replay`` applies them. ``quick_heartbeat`` answers
the steady state without records. Pure: no I/O, no clock.
"""

from __future__ import annotations

from sluice.codec.filter import parse_filter
from sluice.common.names import validate_client_id, validate_group, validate_topic
from sluice.coordinator.assignors import get_assignor
from sluice.coordinator.groups.group import Group
from sluice.coordinator.groups.model import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    MAX_TIMEOUT_MS,
    MIN_TIMEOUT_MS,
    STATIC_LEAVE_EPOCH,
    AssignedPartition,
    HeartbeatRequest,
    HeartbeatResponse,
    MessageModel,
    Slot,
    TopicPartition,
)
from sluice.coordinator.groups.planning import Change, GroupsBase
from sluice.coordinator.groups.reconcile import MemberState, Reconciled, reconcile
from sluice.coordinator.groups.records import MemberRecord, new_current_record, new_member_record
from sluice.coordinator.groups.sessions import MemberSoft
from sluice.coordinator.records import Result
from sluice.errors import (
    FencedMemberEpoch,
    InconsistentSubscription,
    InvalidArgument,
    InvalidFilter,
    InvalidRequest,
    LimitExceeded,
    UnknownAssignor,
    UnknownGroup,
    UnknownMember,
    UnknownTopicOrPartition,
    echo,
)

_STABLE = MemberState.STABLE.value

# Refusals answered in the heartbeat response's ``error`` (the member acts on them); anything else raised
# by a handler (a malformed request) fails the RPC.
_PROTOCOL_ERRORS = (
    FencedMemberEpoch,
    InconsistentSubscription,
    InvalidFilter,
    LimitExceeded,
    UnknownAssignor,
    UnknownMember,
    UnknownTopicOrPartition,
)


class HeartbeatHandlers(GroupsBase):
    """Heartbeat (join, leave, regular) and LeaveGroup. Mixed into :class:`GroupsState`."""

    # ---- heartbeat ------------------------------------------------------------------------------

    def heartbeat(self, req: HeartbeatRequest, now_ms: int, new_member_id: str) -> Result[HeartbeatResponse]:
        """One member heartbeat: join (epoch 0), leave (-1), static leave (-2) or a regular heartbeat.

        ``new_member_id`` is the id a joining member gets (chosen by the caller, so this stays
        deterministic). Protocol refusals come back in ``response.error``; malformed input raises.
        """
        validate_group(req.group)
        # Kept in the member's record (memory and Redis) for as long as it is a member: bounded.
        validate_client_id(req.client_id)
        validate_client_id(req.instance_id, "instance id")
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
                    f"member {echo(req.member_id)} is not in group {req.group!r} (it left, timed out or was "
                    "fenced): join again with an empty member_id"
                )
            member_id = req.member_id
        else:
            member_id = new_member_id
        if member_id not in g.members:
            self._check_room(g)
        record = self._member_record(g, member_id, req, req.instance_id)
        # Re-joining an existing member id always gets a new member epoch, so commits of the previous
        # incarnation (a zombie) are refused by the offset store.
        existing = member_id in g.members
        change = self._plan(g, now_ms, record, (), force=existing)
        return self._answer(g, change, member_id, req, now_ms, joined=True)

    def _check_room(self, g: Group) -> None:
        """Refuse a join that would pass ``max_groups`` (a new group) or ``max_members_per_group``."""
        settings = self.settings
        if g.group_id not in self.groups and settings.max_groups and len(self.groups) >= settings.max_groups:
            raise LimitExceeded(
                f"groups: {len(self.groups) + 1} would exceed the limit max_groups={settings.max_groups}",
                limit="max_groups",
                value=settings.max_groups,
            )
        limit = settings.max_members_per_group
        if limit and len(g.members) >= limit:
            raise LimitExceeded(
                f"members of group {g.group_id!r}: {len(g.members) + 1} would exceed the limit "
                f"max_members_per_group={limit}",
                limit="max_members_per_group",
                value=limit,
            )

    def _heartbeat(self, req: HeartbeatRequest, now_ms: int) -> Result[HeartbeatResponse]:
        g = self.groups.get(req.group)
        if g is None or req.member_id not in g.members:
            raise UnknownMember(
                f"member {echo(req.member_id)} is not in group {req.group!r} (it left, timed out or was "
                "fenced): release every partition and join again with member_epoch 0 and an empty member_id"
            )
        cur = g.reconciled(req.member_id)
        if req.member_epoch != cur.member_epoch:
            lost_answer = req.member_epoch == cur.previous_member_epoch and req.owned <= g.owned_tps.get(
                req.member_id, frozenset()
            )
            if not lost_answer:
                relation = "newer than" if req.member_epoch > cur.member_epoch else "older than"
                raise FencedMemberEpoch(
                    f"member {echo(req.member_id)} of group {req.group!r} sent epoch {req.member_epoch}, "
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
            change = Change(g, g.members, g.tracks, g.targets, g.group_epoch, g.assignment_epoch, g.config)
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

    # ---- reconciling the heartbeating member ----------------------------------------------------

    def _answer(
        self,
        g: Group,
        change: Change,
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
        change = Change(g, g.members, g.tracks, g.targets, g.group_epoch, g.assignment_epoch, g.config)
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
        self, g: Group, change: Change, member_id: str, req: HeartbeatRequest, before: Reconciled | None
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
        change: Change,
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
            raise UnknownMember(
                f"member {echo(member_id)} is not in group {group!r} (already left or timed out)"
            )
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


def _fingerprint(req: HeartbeatRequest) -> tuple[object, ...]:
    return (
        req.client_id,
        tuple(sorted(req.subscription.items())),
        req.assignor,
        req.message_model,
        req.rebalance_timeout_ms,
        req.session_timeout_ms,
    )
