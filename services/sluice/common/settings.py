"""The one converter from a setting's raw value to its declared type.

Used by the services' configs (``server/config.py``: TOML file, ``SLUICE_<SERVICE>_<FIELD>``, ``--flags``)
and by the SDK's settings (``client.producer(topic, linger="5ms")``), so a setting is spelled the same way
everywhere (``common/units.py`` parses the spellings):

- text is parsed: durations ``250ms``/``5s``/``7d`` (or seconds), sizes ``64MiB`` (or a plain integer,
  which may be negative: -1 means "none" for several settings), booleans ``true/false``, ``yes/no``,
  ``on/off``, ``1/0``;
- any other value must already be of the setting's kind: a bool is never an int or a duration, a float
  never an int (no silent truncation), a number never a string;
- ``X | None``: ``None`` or an empty text is None, anything else is an ``X``;
- other types (enums, ``Any``, callables) pass through unchanged: their owner validates them.

Errors are ``InvalidArgument`` naming the setting: ``producer setting linger: ...`` for the SDK (``owner``
given), ``--port: ...`` / ``SLUICE_BROKER_PORT: ...`` for a service (the name says where it came from).
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from sluice.common.units import parse_duration, parse_size
from sluice.errors import InvalidArgument

__all__ = ["convert_setting"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_SIGNED_INT = re.compile(r"^\s*-?\d+\s*$")


def convert_setting(owner: str, name: str, tp: Any, raw: Any) -> Any:
    """``raw`` as type ``tp``. ``owner`` ("producer", "consumer", ...) prefixes the setting's name in
    errors; "" for a service setting, whose ``name`` is the flag, env variable or file key."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if raw is None or raw == "":
            return None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    convert = _CONVERTERS.get(tp)
    if convert is None:
        return raw
    where = f"{owner} setting {name}" if owner else name
    try:
        return convert(raw)
    except _Mistyped:
        raise InvalidArgument(f"{where}: expected {_KINDS[tp]}, got {raw!r}") from None
    except InvalidArgument as exc:  # the parser's own words ("invalid duration 'soon': use e.g. ...")
        raise InvalidArgument(f"{where}: {exc.message}") from None
    except (TypeError, ValueError, OverflowError):
        raise InvalidArgument(f"{where}: expected {_KINDS[tp]}, got {raw!r}") from None


class _Mistyped(Exception):
    """The value is of the wrong kind, or text that does not spell one (reported with the expected kind)."""


def _duration(raw: Any) -> timedelta:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float | timedelta):
        raise _Mistyped
    return parse_duration(raw)


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = raw.strip().lower() if isinstance(raw, str) else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise _Mistyped


def _int(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise _Mistyped
    if isinstance(raw, int) or _SIGNED_INT.match(raw):
        return int(raw)
    try:
        return parse_size(raw)
    except InvalidArgument:
        raise _Mistyped from None


def _float(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise _Mistyped
    return float(raw)


def _str(raw: Any) -> str:
    if not isinstance(raw, str):
        raise _Mistyped
    return raw


def _path(raw: Any) -> Path:
    if not isinstance(raw, str | Path):
        raise _Mistyped
    return Path(raw)


_CONVERTERS: dict[Any, Callable[[Any], Any]] = {
    timedelta: _duration,
    bool: _bool,
    int: _int,
    float: _float,
    str: _str,
    Path: _path,
}
_KINDS: dict[Any, str] = {
    timedelta: "a duration (a timedelta, seconds, or text such as 250ms, 5s, 2m, 1h, 7d)",
    bool: "a boolean (true/false, yes/no, on/off, 1/0)",
    int: "an integer or a size such as 64MiB",
    float: "a number",
    str: "a string",
    Path: "a path",
}
