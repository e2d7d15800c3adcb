"""Where to start or reset, as people write it on the command line.

- ``consume --from``: ``earliest``, ``latest``, ``offset:N``, ``time:ISO`` or ``-DURATION`` (``-15m``: the
  first record of the last 15 minutes);
- ``group reset-offsets --to-datetime ISO``.

An ISO time is ``datetime.fromisoformat``'s: ``2026-11-25T09:30:00Z``, ``2026-11-25T10:30+01:00``,
``2026-11-25`` (midnight). Without a zone it is local time, as Kafka's ``--to-datetime`` and ``date``
read it. A time in the future is a mistake (a wrong year or zone), refused as INVALID_ARGUMENT rather
than silently read as "latest".
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from datetime import datetime

from sluice.common.units import iso_ms, parse_duration
from sluice.errors import InvalidArgument, SluiceError

__all__ = ["Start", "check_not_future", "join_dash_values", "parse_datetime", "parse_start"]

#: Options whose value may start with "-" (a relative time): argparse would take it for an option.
DASH_VALUE_OPTIONS = ("--from",)


@dataclass(frozen=True, slots=True)
class Start:
    """``kind``: "earliest", "latest", "offset" (value: the offset) or "time" (value: ms since the
    epoch, already resolved for a relative ``-15m``)."""

    kind: str
    value: int = 0

    def __str__(self) -> str:
        if self.kind == "offset":
            return f"offset:{self.value}"
        if self.kind == "time":
            return f"time:{iso_ms(self.value)}"
        return self.kind


def now_ms() -> int:
    return int(time.time() * 1000)


def parse_datetime(text: str) -> int:
    """An ISO 8601 time -> ms since the epoch (argparse ``type=``)."""
    try:
        return int(datetime.fromisoformat(text.strip()).timestamp() * 1000)
    except (ValueError, OverflowError, OSError):
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time like 2026-11-25T09:30:00Z, got {text!r}"
        ) from None


def check_not_future(ms: int, what: str) -> None:
    """INVALID_ARGUMENT when ``ms`` has not come yet."""
    now = now_ms()
    if ms > now:
        raise InvalidArgument(
            f"{what} {iso_ms(ms)} is in the future (now is {iso_ms(now)}); give a past time, or latest"
        )


def parse_start(text: str) -> Start:
    """``consume --from`` (argparse ``type=``): earliest, latest, offset:N, time:ISO or -DURATION."""
    value = text.strip()
    if value in ("earliest", "latest"):
        return Start(value)
    kind, sep, rest = value.partition(":")
    if sep and kind == "offset":
        if not rest.isdigit():
            raise argparse.ArgumentTypeError(f"offset:N needs an offset >= 0, got {text!r}")
        return Start("offset", int(rest))
    if sep and kind == "time":
        return Start("time", parse_datetime(rest))
    if value.startswith("-"):
        try:
            back = parse_duration(value[1:])
        except SluiceError:
            back = None
        if back is not None and back.total_seconds() > 0:
            return Start("time", now_ms() - int(back.total_seconds() * 1000))
    raise argparse.ArgumentTypeError(
        f"expected earliest, latest, offset:N, time:ISO-8601 or a duration back like -15m, got {text!r}"
    )


def join_dash_values(argv: list[str]) -> list[str]:
    """``--from -15m`` -> ``--from=-15m``, so argparse does not take ``-15m`` for an option."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if arg in DASH_VALUE_OPTIONS and nxt[:1] == "-" and nxt[1:2].isdigit():
            out.append(f"{arg}={nxt}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out
