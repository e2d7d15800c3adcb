"""Service configuration: a dataclass per service, filled from file, env and flags.

Precedence, lowest first: field defaults, a TOML file (``--config``), environment
variables (``SLUICE_<SERVICE>_<FIELD>``, e.g. ``SLUICE_BROKER_DATA_DIR``), then
command-line flags (``--data-dir``). Unknown keys in the file are rejected.
Each field documents itself with ``field(metadata={"help": ...})``; durations
are ``timedelta`` and accept ``250ms``, ``5s``, ``2m``, ``1h``, ``7d``. Values are converted by
``common/settings.py``, the converter the SDK's settings use too.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import typing
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from sluice.common.settings import convert_setting
from sluice.common.units import parse_duration, parse_size
from sluice.errors import InvalidArgument

__all__ = ["add_arguments", "load", "parse_duration", "parse_size"]

T = TypeVar("T")


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """One ``--flag`` per dataclass field, with the field's help text."""
    parser.add_argument("--config", type=Path, help="TOML file with settings (flags and env override it)")
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else None
        parser.add_argument(
            flag,
            dest=f.name,
            default=None,
            metavar=f.name.upper(),
            help=f"{help_text} (default: {_show(default)}; type: {_type_name(hints[f.name])})",
        )


def _show(value: Any) -> str:
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    return repr(value)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def load(
    cls: type[T],
    env_prefix: str,
    args: argparse.Namespace | None = None,
    env: typing.Mapping[str, str] | None = None,
) -> T:
    """Build a config from defaults < file < env < flags; reject unknown file keys."""
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    config_file = getattr(args, "config", None) if args is not None else None
    if config_file is not None:
        try:
            data = tomllib.loads(Path(config_file).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgument(f"cannot read config file {config_file}: {exc}") from exc
        unknown = set(data) - names
        if unknown:
            raise InvalidArgument(f"unknown settings in {config_file}: {', '.join(sorted(unknown))}")
        for k, v in data.items():
            values[k] = convert_setting("", k, hints[k], v)
    for name in names:
        key = f"{env_prefix}{name.upper()}"
        if key in env:
            values[name] = convert_setting("", key, hints[name], env[key])
    if args is not None:
        for name in names:
            raw = getattr(args, name, None)
            if raw is not None:
                values[name] = convert_setting("", "--" + name.replace("_", "-"), hints[name], raw)
    return cls(**values)
