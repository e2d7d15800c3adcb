"""Where ``consume --from`` starts and what ``group reset-offsets`` takes, parsed before any connection."""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

import pytest

from sluice.cli import commands
from sluice.cli.group_offsets import reset_to
from sluice.cli.positions import Start, check_not_future, join_dash_values, parse_datetime, parse_start
from sluice.errors import InvalidArgument


def parse(*argv: str) -> argparse.Namespace:
    return commands.build_parser().parse_args(join_dash_values(list(argv)))


def test_consume_from_forms() -> None:
    assert parse_start("earliest") == Start("earliest")
    assert parse_start("latest") == Start("latest")
    assert parse_start("offset:42") == Start("offset", 42)
    assert parse_start("time:2026-11-25T09:30:00Z") == Start("time", 1_795_599_000_000)
    assert parse_start("time:2026-11-25T10:30:00+01:00") == Start("time", 1_795_599_000_000)
    before = int(time.time() * 1000)
    start = parse_start("-15m")
    after = int(time.time() * 1000)
    assert start.kind == "time"
    assert before - 900_000 <= start.value <= after - 900_000
    assert str(Start("offset", 3)) == "offset:3"
    assert str(Start("time", 1_795_599_000_000)) == "time:2026-11-25T09:30:00.000Z"


def test_a_relative_start_needs_no_equals_sign() -> None:
    """argparse takes ``-15m`` for an option; ``--from -15m`` is rewritten to ``--from=-15m``."""
    assert join_dash_values(["consume", "t", "--from", "-15m", "--max", "1"]) == [
        "consume", "t", "--from=-15m", "--max", "1",
    ]  # fmt: skip
    # Only --from, and only a dash followed by a digit: flags stay flags.
    assert join_dash_values(["--from", "-h"]) == ["--from", "-h"]
    assert join_dash_values(["--shift-by", "-5"]) == ["--shift-by", "-5"]
    args = parse("consume", "orders", "--from", "-2h")
    assert args.start.kind == "time"
    assert abs(args.start.value - (time.time() * 1000 - 7_200_000)) < 60_000


def test_naive_times_are_local_and_zoned_times_are_exact() -> None:
    assert parse_datetime("2026-11-25T09:30:00Z") == 1_795_599_000_000
    assert parse_datetime("2026-11-25") == int(datetime(2026, 11, 25).timestamp() * 1000)
    with pytest.raises(argparse.ArgumentTypeError, match="ISO 8601"):
        parse_datetime("25/11/2026")


def test_a_future_time_is_a_typed_error() -> None:
    future = int(datetime(2100, 1, 1, tzinfo=UTC).timestamp() * 1000)
    with pytest.raises(InvalidArgument, match=r"2100-01-01T00:00:00\.000Z is in the future"):
        check_not_future(future, "--from time:")
    check_not_future(int(time.time() * 1000) - 1, "--from time:")


def test_reset_offsets_flags() -> None:
    args = parse("group", "reset-offsets", "g", "--topic", "a", "--topic", "b:0,2", "--shift-by", "-5")
    assert args.topic == [("a", None), ("b", [0, 2])]
    assert not args.execute
    to = reset_to(args)
    assert (to.kind, to.value) == ("shift", -5)
    args = parse(
        "group", "reset-offsets", "g", "--all-topics", "--to-datetime", "2026-11-25T09:30:00Z", "--execute"
    )
    assert args.all_topics
    assert args.execute
    assert (reset_to(args).kind, reset_to(args).value) == ("timestamp", 1_795_599_000_000)
    args = parse("group", "reset-offsets", "g", "-t", "a", "--by-duration", "15m")
    to = reset_to(args)
    assert to.kind == "timestamp"
    assert abs(to.value - (time.time() * 1000 - 900_000)) < 60_000
    assert reset_to(parse("group", "reset-offsets", "g", "-t", "a", "--to-offset", "7")).value == 7
    assert reset_to(parse("group", "reset-offsets", "g", "-t", "a", "--to-earliest")).kind == "earliest"


def test_a_bad_duration_is_a_typed_error(capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing listens on port 1: the duration is refused before any connection.
    code = commands.main(
        ["--bootstrap", "127.0.0.1:1", "group", "reset-offsets", "g", "-t", "a", "--by-duration", "soon"]
    )
    assert code == 1
    assert capsys.readouterr().err.startswith("error: INVALID_ARGUMENT: invalid duration 'soon'")
