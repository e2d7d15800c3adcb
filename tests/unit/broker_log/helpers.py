"""Builders shared by the partition-log tests: batches, a fake clock, log files."""

from __future__ import annotations

from pathlib import Path

from sluice.broker.log import LogConfig, PartitionLog
from sluice.codec.batch import BatchBuilder, Record, decode_records


class Clock:
    """A settable millisecond clock (time passed in, as the style guide asks)."""

    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now = now_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def make_batch(
    count: int, ts: int = 1_000, value_size: int = 10, tag: str | None = None, seed: int = 0
) -> bytes:
    """A producer batch of ``count`` records with timestamps ts, ts+1, ..."""
    b = BatchBuilder()
    for i in range(count):
        value = f"{seed}:{i}:".encode().ljust(value_size, b"x")
        b.append(value, f"k{i % 7}".encode(), tag, None, ts + i)
    return b.build()


def ts_batch(timestamps: list[int], seed: int = 0) -> bytes:
    """A batch whose records carry exactly these timestamps (in this order)."""
    b = BatchBuilder()
    for i, ts in enumerate(timestamps):
        b.append(f"{seed}:{i}".encode(), None, None, None, ts)
    return b.build()


def read_all(log: PartitionLog, start: int | None = None) -> list[Record]:
    """Every record from ``start`` (default: log start) to the end, via read()."""
    offset = log.log_start_offset if start is None else start
    out: list[Record] = []
    while offset < log.log_end_offset:
        res = log.read(offset, 1 << 20)
        assert res.data, "read made no progress"
        out += decode_records(res.data, "t", 0, start_offset=offset)
        offset = res.next_offset
    return out


def segment_files(directory: Path, suffix: str = ".log") -> list[Path]:
    return sorted(directory.glob(f"*{suffix}"))


def small_config(**overrides: int) -> LogConfig:
    values = {"segment_bytes": 4096, "index_interval_bytes": 256, "retention_ms": -1}
    values.update(overrides)
    return LogConfig(**values)


def abandon(log: PartitionLog) -> None:
    """Release the descriptors without the clean-shutdown work close() does."""
    for seg in log._segments:
        seg.close()
    log._unsynced_paths.clear()
    log._closed = True
