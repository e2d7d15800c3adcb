"""The command line under any arguments: a parsed command, or a usage error (exit 2) with a message.
Never a traceback. Covers the user commands (``sluice topic ...``) and every service's flags
(``sluice broker ...``), whose values go through the typed settings loader.

The argument lists are built from the parsers themselves (every sub-command path and every option
string they declare, found by walking argparse's actions), then mixed with values that are wrong in
the ways people get them wrong: negative, huge, empty, a duration without a unit, non-UTF-8-looking
text, a dash-leading value.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
from collections.abc import Callable
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.cli.commands import build_parser
from sluice.cli.main import SERVICES
from sluice.cli.positions import join_dash_values
from sluice.errors import SluiceError
from sluice.server.config import add_arguments


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], list[str]]]:
    """Every (sub-command path, its option strings) under ``parser``."""
    options = [s for action in parser._actions for s in action.option_strings if s not in ("-h", "--help")]
    found = [(path, options)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _walk(child, (*path, name))
    return found


@cache
def _commands() -> list[tuple[tuple[str, ...], list[str]]]:
    return [(path, options) for path, options in _walk(build_parser(), ()) if path]


VALUES = st.one_of(
    st.sampled_from(["0", "-1", "1", "10", "99999999999999999999", "", "1s", "-15m", "1.5", "nan", "inf"]),
    st.sampled_from(["earliest", "latest", "x:y", "127.0.0.1:1", "a=b", "@", "\x7f", "é", "--"]),
    st.text(max_size=12),
)


@st.composite
def command_line(draw: st.DrawFn, commands: list[tuple[tuple[str, ...], list[str]]]) -> list[str]:
    path, options = draw(st.sampled_from(commands))
    argv = list(path)
    for _ in range(draw(st.integers(0, 6))):
        with_option: bool = draw(st.integers(0, 2)) > 0  # two in three values follow an option
        if options and with_option:
            argv.append(draw(st.sampled_from(options)))
        argv.append(draw(VALUES))
    return argv


def _outcome(parse: Callable[[list[str]], object], argv: list[str]) -> tuple[str, object, str]:
    """Run one parse: ("ok", result), ("exit", code) or ("typed", the error); stderr as the third."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return "ok", parse(argv), err.getvalue()
        except SystemExit as exc:
            return "exit", exc.code, err.getvalue()
        except SluiceError as exc:  # the settings loader's typed refusal (InvalidArgument)
            return "typed", exc, err.getvalue()


def _exits_cleanly(parse: Callable[[list[str]], object], argv: list[str]) -> None:
    """A result, SystemExit 0/2 with something said on stderr, or a short typed error; nothing else."""
    kind, value, stderr = _outcome(parse, argv)
    if kind == "exit":
        assert value in (0, 2), f"{argv!r} exited {value!r}"
        assert value == 0 or "error" in stderr, f"{argv!r}: usage exit with no message"
    elif kind == "typed":
        assert len(str(value)) < 2_000, "an error echoes its input at full size"
    assert "Traceback" not in stderr


@given(st.data())
def test_user_commands_parse_or_fail_with_usage(data: st.DataObject) -> None:
    argv = data.draw(command_line(_commands()))
    _exits_cleanly(lambda a: build_parser().parse_args(join_dash_values(a)), argv)


@cache
def _service_parse(name: str) -> tuple[Callable[[list[str]], object], list[str]]:
    """The service's ``parse_config`` and the long options its config class declares."""
    module = importlib.import_module(SERVICES[name])
    config_class = next(
        value
        for attr, value in vars(module).items()
        if attr.endswith("Config") and isinstance(value, type) and value.__module__.endswith(".config")
    )
    parser = argparse.ArgumentParser()
    add_arguments(parser, config_class)
    options = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
    return module.parse_config, [s for s in options if s != "--help"]


@pytest.mark.parametrize("service", sorted(SERVICES))
@given(data=st.data())
def test_service_flags_load_or_fail_typed(service: str, data: st.DataObject) -> None:
    parse, options = _service_parse(service)
    argv: list[str] = []
    for _ in range(data.draw(st.integers(1, 5))):
        argv += [data.draw(st.sampled_from(options)), data.draw(VALUES)]
    _exits_cleanly(parse, argv)
