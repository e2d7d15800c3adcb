"""The target assignment of a group: the assignor run once per offset track. Pure.

Clustering: each track's partitions are divided among that track's members only (so in seed 004's
scenario under ``split``, the tagA member and the tagB member each own all 4 partitions, on their own
tracks). Broadcasting: every member gets every partition of its topics; there is nothing to divide.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from sluice.coordinator.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, GroupSpec, MemberSpec, get_assignor
from sluice.coordinator.groups.model import DEFAULT_TRACK, GroupConfig, MessageModel, Slot
from sluice.coordinator.groups.records import MemberRecord, TrackEntry

__all__ = ["choose_assignor", "compute_targets", "track_of"]

Tracks = Mapping[tuple[str, str], TrackEntry]


def track_of(tracks: Tracks, topic: str, filter_expression: str) -> str:
    entry = tracks.get((topic, filter_expression))
    return entry.track if entry is not None else DEFAULT_TRACK


def choose_assignor(config: GroupConfig, members: Mapping[str, MemberRecord]) -> str:
    """The group config's assignor; else the one most members ask for (ties: by name); else sticky."""
    if config.assignor:
        return config.assignor
    votes = Counter(m.assignor for m in members.values() if m.assignor in ASSIGNORS)
    if not votes:
        return DEFAULT_ASSIGNOR
    return min(votes.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def compute_targets(
    members: Mapping[str, MemberRecord],
    tracks: Tracks,
    current: Mapping[str, frozenset[Slot]],
    assignor_name: str,
    partitions: Mapping[str, int],
) -> dict[str, frozenset[Slot]]:
    """member_id -> its target slots.

    ``current`` is the previous target (what ``sticky`` sticks to); ``partitions`` the partition count
    of every existing topic the members subscribe (a missing topic has none to give).
    """
    broadcasting = any(m.message_model is MessageModel.BROADCASTING for m in members.values())
    if broadcasting:
        return {
            mid: frozenset(
                (track_of(tracks, topic, expr), topic, p)
                for topic, expr in m.subscription.items()
                for p in range(partitions.get(topic, 0))
            )
            for mid, m in members.items()
        }
    # track -> member -> topics it reads on that track.
    by_track: dict[str, dict[str, set[str]]] = {}
    for mid, m in members.items():
        for topic, expr in m.subscription.items():
            by_track.setdefault(track_of(tracks, topic, expr), {}).setdefault(mid, set()).add(topic)
    assignor = get_assignor(assignor_name)
    result: dict[str, set[Slot]] = {mid: set() for mid in members}
    for track in sorted(by_track):
        on_track = by_track[track]
        spec = GroupSpec(
            members={
                mid: MemberSpec(mid, members[mid].instance_id or None, frozenset(topics))
                for mid, topics in on_track.items()
            },
            current={
                mid: frozenset((t, p) for tr, t, p in current.get(mid, ()) if tr == track) for mid in on_track
            },
        )
        topics = {t for ts in on_track.values() for t in ts}
        counts = {t: partitions[t] for t in sorted(topics) if t in partitions}
        for mid, tps in assignor.assign(spec, counts).items():
            result[mid].update((track, t, p) for t, p in tps)
    return {mid: frozenset(slots) for mid, slots in result.items()}
