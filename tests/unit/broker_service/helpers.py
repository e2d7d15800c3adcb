"""Small builders shared by the broker service unit tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sluice.broker.log.config import LogConfig
from sluice.broker.log.partition_log import PartitionLog
from sluice.codec.batch import BatchBuilder, decode_records


def batch(values: Sequence[bytes], tags: Sequence[str | None] | str | None = None, ts: int = 1_000) -> bytes:
    """One encoded batch; ``tags`` is one tag for all records or one per record."""
    b = BatchBuilder()
    for i, value in enumerate(values):
        tag = tags if tags is None or isinstance(tags, str) else tags[i]
        b.append(value, None, tag, None, ts + i)
    return b.build()


def values(n: int, prefix: str = "v", size: int = 0) -> list[bytes]:
    return [(f"{prefix}{i}".encode()).ljust(size, b".") for i in range(n)]


def open_log(directory: Path, **config: int) -> PartitionLog:
    return PartitionLog(directory, LogConfig(**config))


def offsets_and_values(data: bytes, start: int = 0) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in decode_records(data, "t", 0, start)]


def tags_of(data: bytes) -> list[str | None]:
    return [r.tag for r in decode_records(data, "t", 0)]
