"""``reset_target``: what ``subscription reset --to`` and ``admin.reset_subscription(to=...)`` take."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from sluice.client.push.sub_admin import reset_target
from sluice.errors import InvalidArgument
from sluice.v1 import offset_store_pb2 as pb


def test_positions_offsets_and_times() -> None:
    assert reset_target("earliest") == (pb.RESET_SPEC_EARLIEST, 0)
    assert reset_target(" LATEST ") == (pb.RESET_SPEC_LATEST, 0)
    assert reset_target("42") == (pb.RESET_SPEC_OFFSET, 42)
    assert reset_target(7) == (pb.RESET_SPEC_OFFSET, 7)
    ms = 1_794_990_400_000
    assert reset_target("2026-11-18T08:26:40Z") == (pb.RESET_SPEC_TIMESTAMP, ms)
    assert reset_target("2026-11-18T08:26:40") == (pb.RESET_SPEC_TIMESTAMP, ms), "no zone: UTC"
    assert reset_target("2026-11-18T09:26:40+01:00") == (pb.RESET_SPEC_TIMESTAMP, ms)
    aware = datetime(2026, 11, 18, 10, 26, 40, tzinfo=timezone(timedelta(hours=2)))
    assert reset_target(aware) == (pb.RESET_SPEC_TIMESTAMP, ms)
    assert reset_target(datetime(2026, 11, 18, 8, 26, 40, 500_000, tzinfo=UTC)) == (
        pb.RESET_SPEC_TIMESTAMP,
        ms + 500,
    )


@pytest.mark.parametrize("bad", ["yesterday", "", "-3", "12abc", -1, 1.5, True, None])
def test_anything_else_is_invalid_argument_naming_it(bad: object) -> None:
    with pytest.raises(InvalidArgument) as info:
        reset_target(bad)  # type: ignore[arg-type]
    assert repr(bad) in str(info.value) or str(bad) in str(info.value)
