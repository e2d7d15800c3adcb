"""A topic delete makes the groups forget its bindings (groups/tracks.py ``topic_deleted``): a topic
re-created under the name must not resume an old binding nor show an old handover. Pure."""

from __future__ import annotations

from sluice.coordinator.groups.group import Group
from sluice.coordinator.groups.records import TrackEntry
from sluice.coordinator.groups.tracks import topic_deleted


def _group(*entries: TrackEntry) -> Group:
    g = Group("g", created_ms=5)
    g.group_epoch, g.assignment_epoch = 7, 6
    g.tracks = {(e.topic, e.filter): e for e in entries}
    return g


def test_idle_bindings_go_and_read_ones_restart_without_a_handover() -> None:
    idle_b = TrackEntry("t", "tagB", "f-b", "default", "tagA", since_ms=10, idle_since_ms=20)
    read_a = TrackEntry("t", "tagA", "default", since_ms=1)
    read_c = TrackEntry("t", "tagC", "f-c", "f-b", "tagB", since_ms=30)
    other = TrackEntry("u", "tagB", "f-b", "default", "tagA", since_ms=10, idle_since_ms=20)
    [record] = topic_deleted([_group(idle_b, read_a, read_c, other)], "t", now_ms=99)
    assert (record.group, record.group_epoch, record.assignment_epoch, record.created_ms) == ("g", 7, 6, 5)
    assert sorted(record.tracks) == sorted(
        [
            TrackEntry("t", "tagA", "default", since_ms=99),
            TrackEntry("t", "tagC", "f-c", since_ms=99),  # no source: nothing is copied or shown
            other,  # another topic's binding of the same track is untouched
        ]
    )


def test_groups_without_bindings_of_the_topic_write_nothing() -> None:
    other = TrackEntry("u", "tagA", "default")
    assert topic_deleted([_group(other), Group("empty")], "t", now_ms=99) == []
