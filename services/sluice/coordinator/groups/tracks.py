"""Per-member subscriptions, conflicts, and offset tracks. Pure.

The coordinator keeps every member's own subscription (never one row per group that the last heartbeat
overwrites, which is what lost RocketMQ messages in seed 004). Two members subscribing one topic with
different filters are a *conflict*, resolved by the group's ``conflict_policy``:

- ``reject``: the newer member is refused with INCONSISTENT_SUBSCRIPTION naming the topic, both
  expressions and a member holding the other one.
- ``split``: each distinct (topic, filter) gets its own offset *track*. The first filter seen on a topic
  owns the ``default`` track; every other filter gets ``f-<sha1(filter)[:10]>`` and starts from the
  committed offsets of the topic's default track (copied in the same atomic write that creates it). A
  split track with no members left is retired (its offsets of that topic are deleted). The default track
  stays bound to its filter while anyone subscribes the topic, so members of that filter return to their
  own position; once nobody subscribes the topic the binding is dropped and the next filter takes it.

Each track is assigned on its own: a partition is owned at most once *per track*.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.coordinator.groups.group import Group
from sluice.coordinator.groups.model import DEFAULT_TRACK, ConflictPolicy
from sluice.coordinator.groups.records import TrackEntry

__all__ = ["Conflict", "plan_tracks", "split_conflicts", "track_id"]


def track_id(filter_expression: str) -> str:
    """The split track of a (normalised) filter: deterministic, a valid offset-store track name."""
    return "f-" + hashlib.sha1(filter_expression.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Conflict:
    topic: str
    expression: str
    other_expression: str
    other_member: str

    def message(self, group: str, member_id: str) -> str:
        return (
            f"inconsistent subscription in group {group!r}: member {member_id} subscribes topic "
            f"{self.topic!r} with filter {self.expression!r}, but member {self.other_member} holds filter "
            f"{self.other_expression!r} for it (conflict_policy=reject). Use one filter for the topic in "
            f"every member of the group, use another group, or let each filter keep its own offsets with "
            f"`sluice group config {group} --conflict-policy split`"
        )


def plan_tracks(
    tracks: Mapping[tuple[str, str], TrackEntry],
    holders: Mapping[str, Mapping[str, set[str]]],
    excluded: set[str],
    policy: ConflictPolicy,
    subscription: Mapping[str, str] | None,
) -> tuple[dict[tuple[str, str], TrackEntry], Conflict | None]:
    """The track table once the members are those in ``holders`` (topic -> filter -> members) minus
    ``excluded``, plus one member subscribing ``subscription`` (None: no such member, e.g. it left).

    Returns the conflict instead (and the unchanged table) when the policy is ``reject``. Costs
    O(topics x filters x |excluded|), not O(members): it runs on every join.
    """

    def others(mids: set[str]) -> bool:
        return len(mids) > sum(1 for m in excluded if m in mids)

    held_by: dict[str, set[str]] = {}  # topic -> filters other members hold
    for topic, filters in holders.items():
        kept = {expr for expr, mids in filters.items() if others(mids)}
        if kept:
            held_by[topic] = kept
    split = policy is ConflictPolicy.SPLIT
    mine = dict(subscription or {})
    if not split:
        for topic in sorted(mine):
            for expr in sorted(held_by.get(topic, ())):
                if expr != mine[topic]:
                    holder = min(holders[topic][expr] - excluded)
                    return dict(tracks), Conflict(topic, mine[topic], expr, holder)
    needed: dict[str, set[str]] = {t: set(f) for t, f in held_by.items()}
    for topic, expr in mine.items():
        needed.setdefault(topic, set()).add(expr)
    table: dict[tuple[str, str], TrackEntry] = {}
    for key, entry in tracks.items():
        topic, expr = key
        if topic not in needed:
            continue  # nobody reads the topic any more: every binding goes
        if expr in needed[topic] or (entry.track == DEFAULT_TRACK and split):
            table[key] = entry
    for topic in sorted(needed):
        has_default = any(e.track == DEFAULT_TRACK for (t, _), e in table.items() if t == topic)
        # Existing members' filters first, so a newcomer never takes the default from them.
        order = sorted(needed[topic], key=lambda e: (e not in held_by.get(topic, ()), e))
        for expr in order:
            if (topic, expr) in table:
                continue
            if not has_default:
                table[(topic, expr)] = TrackEntry(topic, expr, DEFAULT_TRACK)
                has_default = True
            else:
                table[(topic, expr)] = TrackEntry(topic, expr, track_id(expr), DEFAULT_TRACK)
    return table, None


def split_conflicts(group: Group) -> list[str]:
    """Human-readable lines for topics that more than one filter reads (split groups)."""
    by_topic: dict[str, list[TrackEntry]] = {}
    for entry in group.tracks.values():
        by_topic.setdefault(entry.topic, []).append(entry)
    lines = []
    for topic in sorted(by_topic):
        entries = sorted(by_topic[topic], key=lambda e: (e.track != DEFAULT_TRACK, e.track))
        if len(entries) < 2:
            continue
        parts = []
        for e in entries:
            holders = sorted(
                m.member_id for m in group.members.values() if m.subscription.get(topic) == e.filter
            )
            parts.append(f"{e.filter!r} -> track {e.track} (members: {', '.join(holders) or 'none'})")
        lines.append(
            f"topic {topic!r} is read with {len(entries)} filters, split into tracks: " + "; ".join(parts)
        )
    return lines
