"""``sluice topic reassign``: its modes and the usage errors decided before any connection (exit 2)."""

from __future__ import annotations

import argparse

import pytest

from sluice.cli import commands


def parse(*argv: str) -> argparse.Namespace:
    return commands.build_parser().parse_args(list(argv))


def test_flags() -> None:
    args = parse("topic", "reassign", "orders", "-p", "2", "--replicas", "3,1,2", "--throttle", "10MiB")
    assert (args.name, args.partition, args.replicas, args.throttle) == ("orders", 2, "3,1,2", "10MiB")
    assert parse("topic", "reassign", "--drain", "0", "--dry-run").drain == 0
    assert parse("topic", "reassign", "--rebalance").rebalance


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "exactly one of"),
        (("--rebalance", "--drain", "1"), "exactly one of"),
        (("--status", "--rebalance"), "exactly one of"),
        (("orders", "--replicas", "1,2"), "needs TOPIC and --partition"),
        (("orders", "-p", "0", "--replicas", "a,b"), "broker ids separated by commas"),
        (("--plan", "/nonexistent/plan.json"), "--plan /nonexistent/plan.json: cannot read it"),
    ],
)
def test_usage_errors_exit_2_before_connecting(
    capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    # The bootstrap is unreachable on purpose: a usage error must come first.
    code = commands.main(["--bootstrap", "127.0.0.1:1", "--request-timeout", "1", "topic", "reassign", *argv])
    _, err = capsys.readouterr()
    assert code == 2
    assert message in err
    assert "Traceback" not in err
