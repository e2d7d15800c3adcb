"""The one setting converter (sluice.common.settings), used by the services' configs and the SDK's settings.

The same spelling means the same value on both sides: a service flag, env variable or TOML value and an
SDK keyword argument go through one function.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from sluice.client.consumer.config import ConsumerConfig
from sluice.client.producer.config import ProducerConfig
from sluice.common.settings import convert_setting
from sluice.errors import InvalidArgument
from sluice.server.config import add_arguments, load


@dataclass
class _Service:
    linger: timedelta = field(default=timedelta(seconds=1), metadata={"help": "linger"})
    batch_size: int = field(default=1, metadata={"help": "batch size"})
    wire_port: int | None = field(default=None, metadata={"help": "wire port"})
    verbose: bool = field(default=False, metadata={"help": "verbose"})
    ratio: float = field(default=0.5, metadata={"help": "ratio"})
    data_dir: Path = field(default=Path("x"), metadata={"help": "dir"})
    name: str = field(default="n", metadata={"help": "name"})


def _refused(where: str, words: str) -> str:
    """The whole start of the error: the code, then the setting, then what is wrong with the value."""
    return "^" + re.escape(f"INVALID_ARGUMENT: {where}: {words}")


def _flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser, _Service)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("tp", "raw", "expected"),
    [
        (timedelta, "250ms", timedelta(milliseconds=250)),
        (timedelta, "7d", timedelta(days=7)),
        (timedelta, 3, timedelta(seconds=3)),
        (timedelta, 0.5, timedelta(milliseconds=500)),
        (timedelta, timedelta(minutes=2), timedelta(minutes=2)),
        (int, "64MiB", 64 * 1024 * 1024),
        (int, "-1", -1),
        (int, " 42 ", 42),
        (int, 7, 7),
        (bool, "yes", True),
        (bool, "OFF", False),
        (bool, "1", True),
        (bool, False, False),
        (float, "2.5", 2.5),
        (float, 3, 3.0),
        (str, "text", "text"),
        (Path, "/var/lib/sluice", Path("/var/lib/sluice")),
        (int | None, "", None),
        (int | None, None, None),
        (int | None, "2KiB", 2048),
        (Any, object, object),  # other types pass through: their owner validates them
    ],
)
def test_spellings(tp: Any, raw: object, expected: object) -> None:
    assert convert_setting("", "x", tp, raw) == expected
    assert convert_setting("producer", "x", tp, raw) == expected


@pytest.mark.parametrize(
    ("tp", "raw", "kind"),
    [
        (timedelta, True, "expected a duration"),  # a bool is never a duration
        (timedelta, "soon", "invalid duration 'soon'"),  # the parser's own words
        (int, True, "expected an integer"),  # a bool is never an int
        (int, 1.5, "expected an integer"),  # a float is never silently truncated
        (int, "-2KiB", "expected an integer"),
        (int, "many", "expected an integer"),
        (bool, "maybe", "expected a boolean"),
        (bool, 1, "expected a boolean"),
        (float, "fast", "expected a number"),
        (float, True, "expected a number"),
        (str, 5, "expected a string"),
        (Path, 5, "expected a path"),
    ],
)
def test_bad_values_are_typed_errors_naming_the_setting(tp: Any, raw: object, kind: str) -> None:
    with pytest.raises(InvalidArgument, match=_refused("--knob", kind)):
        convert_setting("", "--knob", tp, raw)
    with pytest.raises(InvalidArgument, match=_refused("consumer setting knob", kind)):
        convert_setting("consumer", "knob", tp, raw)


def test_service_config_and_sdk_settings_agree() -> None:
    """The same text gives the same value through a service flag, an env variable and an SDK keyword."""
    flags = load(_Service, "S_", _flags("--linger", "5ms", "--batch-size", "64KiB"), env={})
    env = load(_Service, "S_", _flags(), env={"S_LINGER": "5ms", "S_BATCH_SIZE": "64KiB"})
    sdk = ProducerConfig().replace(linger="5ms", batch_size="64KiB")
    assert flags.linger == env.linger == sdk.linger == timedelta(milliseconds=5)
    assert flags.batch_size == env.batch_size == sdk.batch_size == 64 * 1024
    assert load(_Service, "S_", _flags("--verbose", "on"), env={}).verbose is True
    assert ConsumerConfig().replace(enable_auto_commit="off").enable_auto_commit is False


def test_the_same_bad_value_is_refused_on_both_sides() -> None:
    with pytest.raises(InvalidArgument, match=_refused("--batch-size", "expected an integer")):
        load(_Service, "S_", _flags("--batch-size", "1.5"), env={})
    with pytest.raises(InvalidArgument, match=_refused("producer setting batch_size", "expected an integer")):
        ProducerConfig().replace(batch_size=1.5)
    with pytest.raises(InvalidArgument, match=_refused("S_LINGER", "invalid duration")):
        load(_Service, "S_", _flags(), env={"S_LINGER": "soon"})
    with pytest.raises(InvalidArgument, match=_refused("producer setting linger", "invalid duration")):
        ProducerConfig().replace(linger="soon")


def test_wrongly_typed_file_values_are_refused(tmp_path: Path) -> None:
    """A TOML value of the wrong type is an error naming the key, not silently coerced (7.9 -> 7)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text("batch_size = 7.9\n")
    with pytest.raises(InvalidArgument, match=_refused("batch_size", "expected an integer")):
        load(_Service, "S_", _flags("--config", str(cfg)), env={})
    cfg.write_text('wire_port = -1\nname = "a"\nverbose = true\nratio = 1\n')
    loaded = load(_Service, "S_", _flags("--config", str(cfg)), env={})
    assert (loaded.wire_port, loaded.name, loaded.verbose, loaded.ratio) == (-1, "a", True, 1.0)
