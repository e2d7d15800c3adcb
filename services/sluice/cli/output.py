"""How records and values are printed, and how ``k=v`` arguments are read.

The JSON rule for bytes (keys, values, header values), like kcat's ``-J`` but
lossless:

* bytes that are valid UTF-8 are printed as a JSON string;
* any other bytes are printed as ``{"base64": "<standard base64>"}``.

So a consumer of ``--format json`` output can always tell the two apart: a string
is the exact text, an object is always base64. A missing key or tag is ``null``.
"""

from __future__ import annotations

import argparse
import base64
import json
from typing import Any, BinaryIO

from sluice.cli.errors import UsageError
from sluice.codec.batch import Record

BASE64_MARKER = "base64"


def bytes_to_json(data: bytes | None) -> str | dict[str, str] | None:
    """UTF-8 text as a string, anything else as ``{"base64": ...}``, None as None."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {BASE64_MARKER: base64.b64encode(data).decode("ascii")}


def json_to_bytes(value: str | dict[str, str] | None) -> bytes | None:
    """The inverse of :func:`bytes_to_json` (for scripts and tests)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    return base64.b64decode(value[BASE64_MARKER], validate=True)


def record_to_dict(record: Record) -> dict[str, Any]:
    return {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": bytes_to_json(record.key),
        "tag": record.tag,
        "headers": {name: bytes_to_json(value) for name, value in record.headers.items()},
        "value": bytes_to_json(record.value),
    }


def format_record(record: Record, fmt: str) -> bytes:
    """One output line (newline included) for ``--format value|json``."""
    if fmt == "json":
        line = json.dumps(record_to_dict(record), ensure_ascii=False, separators=(",", ":"))
        return line.encode("utf-8") + b"\n"
    # The raw value, byte for byte: binary-safe as long as values hold no newline.
    return record.value + b"\n"


def key_value(text: str) -> tuple[str, str]:
    """argparse ``type=`` for ``k=v``: the value may itself contain '='; the key may not be empty."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return name, value


def positive_float(text: str) -> float:
    """argparse ``type=`` for a number of seconds that must be > 0."""
    value = float(text)
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def collect_pairs(pairs: list[tuple[str, str]] | None, what: str) -> dict[str, str]:
    """Turn repeated ``--x k=v`` into a dict; a key given twice is a usage error."""
    out: dict[str, str] = {}
    for name, value in pairs or ():
        if name in out:
            raise UsageError(f"{what} {name!r} given twice")
        out[name] = value
    return out


class Printer:
    """Writes records to ``out`` and counts them against ``--max``."""

    def __init__(self, out: BinaryIO, fmt: str, limit: int | None) -> None:
        self.out = out
        self.fmt = fmt
        self.limit = limit
        self.count = 0

    @property
    def done(self) -> bool:
        return self.limit is not None and self.count >= self.limit

    def write(self, records: list[Record]) -> None:
        if self.limit is not None:
            records = records[: self.limit - self.count]
        self.out.write(b"".join(format_record(r, self.fmt) for r in records))
        # Flush per fetched batch, not per record: a pipe sees records promptly
        # without a system call per line.
        self.out.flush()
        self.count += len(records)
