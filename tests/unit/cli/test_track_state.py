"""``sluice track``'s per-track verdict, including what a handover hid from a filter."""

from __future__ import annotations

import pytest

from sluice.cli.track import (
    CONSUMED,
    CONSUMED_BEFORE_HANDOVER,
    CONSUMED_BUT_FILTERED,
    NOT_CONSUME_YET,
    NOT_ONLINE,
    SKIPPED_AT_HANDOVER,
    track_state,
)


@pytest.mark.parametrize(
    ("offset", "tag", "filter_expr", "committed", "handover", "inherited", "expected"),
    [
        (5, "tagB", None, 9, None, "", NOT_ONLINE),  # no filter bound to the track
        (9, "tagB", "tagB", 9, None, "", NOT_CONSUME_YET),
        (5, "tagB", "tagB", None, None, "", NOT_CONSUME_YET),
        (5, "tagB", "tagB", 9, None, "", CONSUMED),
        (5, "tagB", "tagA", 9, None, "", CONSUMED_BUT_FILTERED),
        # The tagB track started at 7, from tagA's position: tagB record 5 was behind it, tagA skipped it.
        (5, "tagB", "tagB", 9, 7, "tagA", SKIPPED_AT_HANDOVER),
        # ... but a record the previous filter matched was consumed under it.
        (5, "tagB", "tagB", 9, 7, "tagA || tagB", CONSUMED_BEFORE_HANDOVER),
        (7, "tagB", "tagB", 9, 7, "tagA", CONSUMED),  # at or after the start: the track's own doing
        (5, "tagA", "tagB", 9, 7, "tagA", CONSUMED_BUT_FILTERED),  # not this filter's record anyway
    ],
)
def test_track_state(
    offset: int,
    tag: str,
    filter_expr: str | None,
    committed: int | None,
    handover: int | None,
    inherited: str,
    expected: str,
) -> None:
    assert track_state(offset, tag, filter_expr, committed, handover, inherited) == expected
