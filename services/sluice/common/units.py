"""Durations and sizes as people write them: ``250ms``, ``5s``, ``7d``; ``64MiB``, ``1GiB``; and times
printed as ISO 8601.

One parser for service configs, SDK configs and the CLI.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sluice.errors import InvalidArgument

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+)\s*(b|kib|mib|gib|kb|mb|gb)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    None: 1,
    "b": 1,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
}


def parse_duration(text: str | int | float | timedelta) -> timedelta:
    """'250ms' / '5s' / '2m' / '1h' / '7d' / a number of seconds -> timedelta."""
    if isinstance(text, timedelta):
        return text
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        m = _DURATION.match(text)
        if not m:
            raise InvalidArgument(f"invalid duration {text[:200]!r}: use e.g. 250ms, 5s, 2m, 1h or 7d")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return timedelta(seconds=seconds)
    except (OverflowError, ValueError):  # beyond timedelta's 999,999,999 days, or NaN
        raise InvalidArgument(f"duration of {seconds:g} s is out of range") from None


def parse_size(text: str | int) -> int:
    """'64MiB' / '1gb' / a number of bytes -> int."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if not m:
        raise InvalidArgument(f"invalid size {text[:200]!r}: use e.g. 1048576, 64MiB or 1GiB")
    return int(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower() or None]


def iso_ms(ms: int) -> str:
    """ms since the epoch as ISO 8601 in UTC (``2026-11-25T09:30:00.000Z``), for messages."""
    try:
        when = datetime.fromtimestamp(ms / 1000, UTC)
    except (OverflowError, OSError, ValueError):  # beyond year 9999
        return f"{ms} ms since the epoch"
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
