"""Soft state of the group protocol: liveness, deadlines and caches. Never persisted.

Liveness is a fact about the last few seconds: a restarted coordinator gives every member a fresh
session (and every pending revocation a fresh rebalance deadline) from the moment it recovers, so a
restart never expires anyone early. Kept outside the durable state so that a reload of the durable
state (after an ambiguous Redis write) keeps it.

Caller: ``GroupsState`` handlers (touch, caches) and its timer (``tick``). Affects: nothing durable.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["GroupSoft", "GroupSoftState", "MemberSoft"]

#: How many refused joins (INCONSISTENT_SUBSCRIPTION) DescribeGroup keeps showing per group.
MAX_REJECTIONS = 5


@dataclass
class MemberSoft:
    last_seen_ms: int
    #: The raw heartbeat fields last accepted (subscription, assignor, ...): an unchanged heartbeat is
    #: recognised by one tuple comparison instead of re-parsing its filters.
    fingerprint: tuple[object, ...] | None = None
    #: Set while the member has partitions to release; past it the member is fenced.
    revoke_deadline_ms: int | None = None
    #: A static member that left with epoch -2: its partitions wait for it until its session expires.
    away: bool = False


@dataclass
class GroupSoft:
    last_assignment_ms: int | None = None
    #: cluster metadata_version when ``topics`` was last checked, and the subscribed topics then
    #: (name -> (topic_id, partitions)): a change (deleted or recreated topic) triggers a new target.
    metadata_version: int = -1
    topics: dict[str, tuple[str, int]] | None = None
    rejections: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_REJECTIONS))
    #: When the group last left STABLE (for the rebalance-duration histogram).
    rebalancing_since_ms: int | None = None
    #: The group epoch of a target assignment being computed off the event loop (None: none is).
    assigning_epoch: int | None = None
    #: (cache key, smallest session timeout of the group's members): the session sweep looks only at
    #: members silent for longer than that.
    min_session_timeout: tuple[object, int] | None = None
    #: Member -> soft state, least recently heard from first (a heartbeat moves its member to the end),
    #: so the session sweep reads the silent members from the front and stops at the first live one:
    #: O(silent members), not O(members), per sweep.
    by_last_seen: OrderedDict[str, MemberSoft] = field(default_factory=OrderedDict)


class GroupSoftState:
    def __init__(self) -> None:
        self.members: dict[tuple[str, str], MemberSoft] = {}
        self.groups: dict[str, GroupSoft] = {}

    def group(self, group: str) -> GroupSoft:
        soft = self.groups.get(group)
        if soft is None:
            soft = self.groups[group] = GroupSoft()
        return soft

    def touch(self, group: str, member_id: str, now_ms: int) -> MemberSoft:
        """The member was heard from now. O(1): one dict lookup and one move to the end."""
        soft = self.members.get((group, member_id))
        if soft is None:
            soft = self._add(group, member_id, now_ms)
        elif now_ms > soft.last_seen_ms:
            soft.last_seen_ms = now_ms
            self.group(group).by_last_seen.move_to_end(member_id)
        return soft

    def member(self, group: str, member_id: str, now_ms: int) -> MemberSoft:
        """The member's soft state; a member not heard from since this coordinator started gets a fresh
        session starting now."""
        soft = self.members.get((group, member_id))
        if soft is None:
            soft = self._add(group, member_id, now_ms)
        return soft

    def _add(self, group: str, member_id: str, now_ms: int) -> MemberSoft:
        soft = self.members[(group, member_id)] = MemberSoft(now_ms)
        order = self.group(group).by_last_seen
        newest = next(reversed(order.values()), None)
        order[member_id] = soft
        if newest is not None and newest.last_seen_ms > now_ms:
            # The order must stay sorted by last_seen; only a clock that went back breaks appending.
            for mid, _ in sorted(order.items(), key=lambda kv: kv[1].last_seen_ms):
                order.move_to_end(mid)
        return soft

    def silent_since(self, group: str, before_ms: int) -> Iterator[tuple[str, MemberSoft]]:
        """Members of ``group`` last heard from before ``before_ms``, least recent first. A snapshot list:
        the caller may forget members while iterating."""
        order = self.group(group).by_last_seen
        out = []
        for mid, soft in order.items():
            if soft.last_seen_ms >= before_ms:
                break
            out.append((mid, soft))
        return iter(out)

    def tracked(self, group: str) -> int:
        """How many members of ``group`` have soft state."""
        soft = self.groups.get(group)
        return len(soft.by_last_seen) if soft is not None else 0

    def forget(self, group: str, member_id: str) -> None:
        if self.members.pop((group, member_id), None) is not None:
            self.group(group).by_last_seen.pop(member_id, None)
