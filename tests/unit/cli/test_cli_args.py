"""Argument parsing and the exit-code contract, for everything decided before a connection."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from sluice.cli import commands
from sluice.cli.errors import UsageError
from sluice.cli.positions import Start
from sluice.cli.topic import parse_topic_config
from sluice.cli.up_ports import Ports, plan_ports


def parse(*argv: str) -> argparse.Namespace:
    return commands.build_parser().parse_args(list(argv))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = commands.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- --bootstrap --------------------------------------------------------------------


def test_bootstrap_defaults_to_the_contract_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLUICE_BOOTSTRAP", raising=False)
    assert parse("topic", "list").bootstrap == "127.0.0.1:7600"


def test_bootstrap_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_BOOTSTRAP", "10.0.0.1:7700")
    assert parse("topic", "list").bootstrap == "10.0.0.1:7700"


@pytest.mark.parametrize(
    "argv",
    [
        ["--bootstrap", "h:1", "topic", "list"],
        ["topic", "--bootstrap", "h:1", "list"],
        ["topic", "list", "--bootstrap", "h:1"],
        ["consume", "t", "-b", "h:1"],
    ],
)
def test_bootstrap_is_accepted_before_or_after_the_sub_command(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_BOOTSTRAP", "env:9")
    assert parse(*argv).bootstrap == "h:1"


def test_request_timeout_before_or_after_the_sub_command() -> None:
    assert parse("topic", "list").request_timeout == 30.0
    assert parse("--request-timeout", "2", "topic", "list").request_timeout == 2.0
    assert parse("topic", "list", "--request-timeout", "0.5").request_timeout == 0.5


# ---- sub-commands -----------------------------------------------------------------------


def test_topic_create_flags() -> None:
    args = parse(
        "topic",
        "create",
        "orders",
        "--partitions",
        "4",
        "--config",
        "retention_ms=7d",
        "-c",
        "segment_bytes=1",
    )
    assert (args.name, args.partitions) == ("orders", 4)
    assert args.config == [("retention_ms", "7d"), ("segment_bytes", "1")]


def test_topic_config_values() -> None:
    # A bare number keeps the unit the key names; anything else goes to the SDK's parser.
    assert parse_topic_config(
        [("retention_ms", "1000"), ("retention_bytes", "1GiB"), ("segment_ms", " 2h ")]
    ) == {
        "retention_ms": 1000,
        "retention_bytes": "1GiB",
        "segment_ms": "2h",
    }
    assert parse_topic_config(None) == {}
    with pytest.raises(UsageError, match="unknown topic config 'colour'"):
        parse_topic_config([("colour", "blue")])


def test_consume_defaults() -> None:
    args = parse("consume", "orders")
    assert args.start == Start("latest")
    assert args.format == "value"
    assert (args.max, args.timeout, args.filter, args.group, args.partition) == (None, None, None, None, None)


def test_consume_flags() -> None:
    args = parse(
        "consume", "orders", "--from", "earliest", "--filter", "a || b", "--max", "3", "--format", "json",
        "--timeout", "1.5", "-p", "0", "-p", "2",
    )  # fmt: skip
    assert (args.start, args.filter, args.max, args.format, args.timeout, args.partition) == (
        Start("earliest"), "a || b", 3, "json", 1.5, [0, 2],
    )  # fmt: skip


def test_produce_flags() -> None:
    args = parse(
        "produce", "orders", "--key", "k", "--tag", "t", "-H", "a=1", "--header", "b=x=y", "--partition", "1"
    )
    assert (args.topic, args.key, args.tag, args.partition) == ("orders", "k", "t", 1)
    assert args.header == [("a", "1"), ("b", "x=y")]


def test_up_flags_and_defaults() -> None:
    args = parse("up")
    assert (args.data_dir, args.port, args.host, args.redis_url, args.metrics_port) == (
        Path("sluice-data"), 7600, "127.0.0.1", None, None,
    )  # fmt: skip
    args = parse("up", "--port", "0", "--data-dir", "/tmp/x", "--redis-url", "redis://h:1/0", "-v")
    assert (args.port, args.data_dir, args.redis_url, args.verbose) == (
        0,
        Path("/tmp/x"),
        "redis://h:1/0",
        True,
    )


def test_port_plan() -> None:
    plan = plan_ports(7600, None)
    assert plan == {
        "coordinator": Ports(7600, 9600),
        "broker": Ports(7601, 9601),
        "offset-store": Ports(7602, 9602),
        "dispatcher": Ports(7603, 9603),
    }
    assert plan_ports(8000, 0)["broker"] == Ports(8001, 0)
    assert set(plan_ports(0, None).values()) == {Ports(0, 0)}


# ---- exit codes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nonsense"],
        ["topic"],
        ["topic", "create"],
        ["topic", "create", "t", "--partitions", "many"],
        ["consume", "t", "--from", "middle"],
        ["consume", "t", "--from", "offset:-1"],
        ["consume", "t", "--from", "offset:x"],
        ["consume", "t", "--from", "time:yesterday"],
        ["consume", "t", "--from", "-0s"],
        ["consume", "t", "--from", "-15 parsecs"],
        ["group", "reset-offsets", "g", "--to-earliest"],
        ["group", "reset-offsets", "g", "--topic", "t"],
        ["group", "reset-offsets", "g", "--topic", "t", "--all-topics", "--to-latest"],
        ["group", "reset-offsets", "g", "--topic", "t", "--to-latest", "--to-earliest"],
        ["group", "reset-offsets", "g", "--topic", "t:", "--to-latest"],
        ["group", "reset-offsets", "g", "--topic", "t:a", "--to-latest"],
        ["group", "reset-offsets", "g", "--topic", "t:-1", "--to-latest"],
        ["group", "reset-offsets", "g", "--topic", "t", "--to-offset", "-1"],
        ["group", "reset-offsets", "g", "--topic", "t", "--to-datetime", "noon"],
        ["group", "delete"],
        ["consume", "t", "--max", "0"],
        ["consume", "t", "--timeout", "-1"],
        ["consume", "t", "--timeout", "0"],
        ["consume", "t", "--format", "xml"],
        ["--request-timeout", "0", "topic", "list"],
        ["produce", "t", "--header", "novalue"],
        ["up", "--port", "70000"],
        ["track", "t", "0", "1"],
    ],
)
def test_argparse_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        commands.main(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["topic", "create", "t", "--config", "colour=blue"], "unknown topic config 'colour'"),
        (["produce", "t", "--header", "a=1", "--header", "a=2"], "--header 'a' given twice"),
        (["produce", "t", "--key", "k", "--key-separator", ":"], "cannot be used together"),
        (["consume", "t", "--group", "g", "--subscription", "s"], "cannot be used together"),
        (["consume", "t", "--group", "g", "--from", "offset:5"], "cannot be used with --group"),
        (["consume", "t", "--group", "g", "--from", "-15m"], "cannot be used with --group"),
        (["consume", "t", "--subscription", "s", "--from", "time:2020-01-01"], "cannot be used with --sub"),
    ],
)
def test_late_usage_errors_exit_2_with_usage(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert "usage:" in err
    assert message in err
    assert out == ""


def test_bad_filter_is_a_typed_error_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing listens on port 1: the filter must be rejected before any connection.
    code, _, err = run(capsys, "--bootstrap", "127.0.0.1:1", "consume", "t", "--filter", "a b")
    assert code == 1
    assert err.startswith("error: INVALID_FILTER: ")
    assert "Traceback" not in err
