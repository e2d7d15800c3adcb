from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

from sluice.errors import InvalidArgument
from sluice.server.config import add_arguments, load, parse_duration, parse_size


@dataclass(frozen=True)
class Sample:
    port: int = field(default=1, metadata={"help": "port"})
    interval: timedelta = field(default=timedelta(seconds=1), metadata={"help": "interval"})
    data_dir: Path = field(default=Path("x"), metadata={"help": "dir"})
    verbose: bool = field(default=False, metadata={"help": "verbose"})


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, Sample)
    return parser.parse_args(list(argv))


def test_precedence_is_defaults_file_env_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('port = 5\ninterval = "250ms"\n')
    got = load(Sample, "S_", _args("--config", str(cfg)), env={"S_PORT": "6"})
    assert got == Sample(port=6, interval=timedelta(milliseconds=250))
    got = load(
        Sample, "S_", _args("--config", str(cfg), "--port", "7", "--verbose", "true"), env={"S_PORT": "6"}
    )
    assert got.port == 7
    assert got.verbose is True


def test_unknown_file_keys_are_rejected(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("prot = 5\n")
    with pytest.raises(InvalidArgument, match=r"unknown settings.*prot"):
        load(Sample, "S_", _args("--config", str(cfg)), env={})


@pytest.mark.parametrize(
    ("text", "seconds"), [("250ms", 0.25), ("5s", 5), ("2m", 120), ("1h", 3600), ("7d", 604800), ("3", 3)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


def test_bad_values_name_the_setting() -> None:
    with pytest.raises(InvalidArgument, match="duration"):
        parse_duration("soon")
    with pytest.raises(InvalidArgument, match="--port: expected an integer"):
        load(Sample, "S_", _args("--port", "many"), env={})
    assert parse_size("64MiB") == 64 * 1024 * 1024


def test_negative_integers_from_flags_and_env() -> None:
    """-1 means "none" for settings such as --wire-port: flags and env must take it, as files do."""
    assert load(Sample, "S_", _args("--port", "-1"), env={}).port == -1
    assert load(Sample, "S_", _args(), env={"S_PORT": "-1"}).port == -1
    assert load(Sample, "S_", _args("--port", "2KiB"), env={}).port == 2048
    with pytest.raises(InvalidArgument, match="--port: expected an integer"):
        load(Sample, "S_", _args("--port=-2KiB"), env={})
