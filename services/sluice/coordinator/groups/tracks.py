"""Per-member subscriptions, conflicts, and offset tracks. Pure.

The coordinator keeps every member's own subscription (never one row per group that the last heartbeat
overwrites, which is what lost RocketMQ messages in seed 004). Two members subscribing one topic with
different filters are a *conflict*, resolved by the group's ``conflict_policy``:

- ``reject``: the newer member is refused with INCONSISTENT_SUBSCRIPTION naming the topic, both
  expressions and a member holding the other one. A topic has one position (the ``default`` track); a
  new filter, once nobody reads the old one, takes it over (a handover, recorded).
- ``split``: each distinct (topic, filter) gets its own offset *track*. The first filter seen on a topic
  owns the ``default`` track; every other filter gets ``f-<sha1(filter)[:10]>``, started from the
  position of the filter it is handed over from (copied in the same atomic write that creates it).

Either way a binding (topic, filter) -> track, and so its committed offsets, outlives its members: a
member returning with the filter resumes its track. Bindings nobody reads expire after the retention
(``GroupSettings.offsets_retention_ms``), with their offsets. Each track is assigned on its own: a
partition is owned at most once *per track*.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from sluice.coordinator.groups.group import Group
from sluice.coordinator.groups.model import DEFAULT_TRACK, ConflictPolicy
from sluice.coordinator.groups.records import GroupMetadataRecord, TrackEntry, new_group_metadata_record

__all__ = ["Conflict", "expire_tracks", "plan_tracks", "split_conflicts", "topic_deleted", "track_id"]


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
    previous: Mapping[str, str] | None = None,
    now_ms: int = 0,
) -> tuple[dict[tuple[str, str], TrackEntry], Conflict | None]:
    """The track table once the members are those in ``holders`` (topic -> filter -> members) minus
    ``excluded``, plus one member subscribing ``subscription`` (None: no such member, e.g. it left)
    whose subscription was ``previous`` (None: it is new).

    Bindings outlive their members: one nobody reads any more is kept, marked idle since ``now_ms``,
    until the retention expires it (:func:`expire_tracks`). A filter without a binding is *handed
    over* a position (docs/groups.md, "Handovers"). Returns the conflict instead (and the unchanged
    table) when the policy is ``reject``. Costs O(topics x filters x |excluded|), not O(members): it
    runs on every join.
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
        idle = 0 if expr in needed.get(topic, ()) else (entry.idle_since_ms or now_ms)
        table[key] = entry if idle == entry.idle_since_ms else replace(entry, idle_since_ms=idle)
    for topic in sorted(needed):
        # Existing members' filters first, so a newcomer never takes the default from them.
        order = sorted(needed[topic], key=lambda e: (e not in held_by.get(topic, ()), e))
        for expr in order:
            if (topic, expr) not in table:
                entry, replaced = _hand_over(table, topic, expr, split, (previous or {}).get(topic), now_ms)
                if replaced is not None:
                    del table[(topic, replaced.filter)]
                table[(topic, expr)] = entry
    return table, None


def _hand_over(
    table: Mapping[tuple[str, str], TrackEntry],
    topic: str,
    expr: str,
    split: bool,
    previous: str | None,
    now_ms: int,
) -> tuple[TrackEntry, TrackEntry | None]:
    """The binding for a filter of ``topic`` that has none, and the binding it replaces (if any).

    - nobody holds the topic's default track: the filter takes it, and no position is handed over
      (it starts from what ``default`` holds: nothing, or an operator's reset);
    - ``reject`` (one position per topic): the filter takes the default track over from the filter
      bound to it (nobody reads that one now, or this would be a conflict), with its position;
    - ``split``: the filter gets a track of its own that starts from the position of the filter the
      member read before (a filter change), else of the default track's filter.
    """
    default = next((e for (t, _), e in table.items() if t == topic and e.track == DEFAULT_TRACK), None)
    if default is None:
        return TrackEntry(topic, expr, DEFAULT_TRACK, since_ms=now_ms), None
    if not split and default.idle_since_ms:
        return TrackEntry(topic, expr, DEFAULT_TRACK, DEFAULT_TRACK, default.filter, now_ms), default
    # (Under reject with the default's filter still read - members left over from a time the group
    # was split - the newcomer gets a track of its own too, rather than moving theirs.)
    origin = table.get((topic, previous)) if previous is not None else None
    origin = origin or default
    return TrackEntry(topic, expr, track_id(expr), origin.track, origin.filter, now_ms), None


def expire_tracks(
    tracks: Mapping[tuple[str, str], TrackEntry], now_ms: int, retention_ms: int
) -> list[TrackEntry]:
    """The bindings nobody has read for ``retention_ms`` or longer (none when it is 0)."""
    if retention_ms <= 0:
        return []
    return sorted(e for e in tracks.values() if e.idle_since_ms and now_ms - e.idle_since_ms >= retention_ms)


def topic_deleted(groups: Iterable[Group], topic: str, now_ms: int) -> list[GroupMetadataRecord]:
    """The group records that forget ``topic``'s bindings, written with the topic's tombstone (topic
    identity, docs/redis-schema.md): a topic re-created under the name must not resume a binding or a
    handover of the old one. An idle binding goes (with its offsets, as an expired one would); a binding
    members still read (they subscribe the name) is kept on its track but starts afresh: no source, no
    inherited filter, so no handover is shown or copied for the new topic. The offsets themselves are
    purged with the topic."""
    out = []
    for g in groups:
        mine = [e for e in g.tracks.values() if e.topic == topic]
        if not mine:
            continue
        kept = [e for e in g.tracks.values() if e.topic != topic]
        kept += [
            replace(e, source="", inherited_filter="", since_ms=now_ms) for e in mine if not e.idle_since_ms
        ]
        out.append(
            new_group_metadata_record(g.group_id, g.group_epoch, g.assignment_epoch, kept, g.created_ms)
        )
    return out


def split_conflicts(group: Group) -> list[str]:
    """Human-readable lines for ``DescribeGroup.conflicts``: topics more than one filter reads (split
    groups), and every handover, so an operator sees where a filter's position came from."""
    by_topic: dict[str, list[TrackEntry]] = {}
    for entry in group.tracks.values():
        by_topic.setdefault(entry.topic, []).append(entry)
    lines = []
    for topic in sorted(by_topic):
        entries = sorted(by_topic[topic], key=lambda e: (e.track != DEFAULT_TRACK, e.track))
        if len(entries) >= 2:
            parts = []
            for e in entries:
                holders = sorted(
                    m.member_id for m in group.members.values() if m.subscription.get(topic) == e.filter
                )
                extra = f"; idle since {_when(e.idle_since_ms)}" if e.idle_since_ms else ""
                if e.source and e.source != e.track:
                    extra += (
                        f"; handed the position of filter {e.inherited_filter!r} (track {e.source}) at "
                        f"{_when(e.since_ms)}"
                    )
                parts.append(
                    f"{e.filter!r} -> track {e.track} (members: {', '.join(holders) or 'none'}{extra})"
                )
            lines.append(
                f"topic {topic!r} is read with {len(entries)} filters, split into tracks: " + "; ".join(parts)
            )
        for e in entries:
            if e.source == e.track:
                lines.append(
                    f"topic {topic!r}: filter {e.filter!r} took over track {e.track} from filter "
                    f"{e.inherited_filter!r} at {_when(e.since_ms)}, with its position: records "
                    f"{e.filter!r} matches that were already behind it were never delivered to "
                    f"{e.filter!r} (`sluice track` names them SKIPPED_AT_HANDOVER)"
                )
    return lines


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
