"""Per-partition log settings (Kafka's segment/retention/index topic configs)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sluice.codec.batch import DEFAULT_HEADER_LIMITS, HEADER_SIZE, HeaderLimits
from sluice.errors import InvalidArgument

WEEK_MS = 7 * 24 * 3600 * 1000
#: Index entries store file positions as u32; keeping a segment's batches starting below 2**31
#: leaves room for one more append of up to 2 GiB before a position could overflow.
MAX_SEGMENT_BYTES = 2**31 - 1


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = 128 * 1024 * 1024
    """Roll to a new segment when an append would make the active segment exceed this."""

    segment_ms: int = WEEK_MS
    """Roll when the active segment's first batch was appended longer ago than this."""

    retention_bytes: int = -1
    """-1: unlimited; else delete the oldest whole segments while the log is larger than this."""

    retention_ms: int = WEEK_MS
    """-1: unlimited; else delete whole segments whose newest record timestamp is older than this."""

    index_interval_bytes: int = 4096
    """Log bytes between two sparse offset-index entries: the most a lookup walks."""

    max_batch_bytes: int = 16 * 1024 * 1024
    """A produced batch larger than this is rejected with BatchTooLarge."""

    max_record_headers: int = DEFAULT_HEADER_LIMITS.max_count
    """A produced record with more headers is refused with LIMIT_EXCEEDED (docs/limits.md)."""

    max_record_header_bytes: int = DEFAULT_HEADER_LIMITS.max_bytes
    """A produced record whose headers take more bytes is refused with LIMIT_EXCEEDED."""

    @property
    def header_limits(self) -> HeaderLimits:
        return HeaderLimits(self.max_record_headers, self.max_record_header_bytes)

    def __post_init__(self) -> None:
        if not 1 <= self.segment_bytes <= MAX_SEGMENT_BYTES:
            raise InvalidArgument(
                f"segment_bytes must be in [1, {MAX_SEGMENT_BYTES}], got {self.segment_bytes}"
            )
        if self.segment_ms <= 0:
            raise InvalidArgument(f"segment_ms must be positive, got {self.segment_ms}")
        if self.retention_bytes < -1:
            raise InvalidArgument(
                f"retention_bytes must be -1 (unlimited) or >= 0, got {self.retention_bytes}"
            )
        if self.retention_ms < -1:
            raise InvalidArgument(f"retention_ms must be -1 (unlimited) or >= 0, got {self.retention_ms}")
        if self.index_interval_bytes < 1:
            raise InvalidArgument(f"index_interval_bytes must be >= 1, got {self.index_interval_bytes}")
        if not HEADER_SIZE + 2 <= self.max_batch_bytes <= MAX_SEGMENT_BYTES:
            raise InvalidArgument(
                f"max_batch_bytes must be in [{HEADER_SIZE + 2}, {MAX_SEGMENT_BYTES}], "
                f"got {self.max_batch_bytes}"
            )

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LogConfig:
        """Build from a mapping (e.g. a partition's metadata file); unknown keys are rejected."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InvalidArgument(f"unknown log config keys: {', '.join(unknown)}")
        values: dict[str, int] = {}
        for name, value in raw.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidArgument(f"log config {name} must be an integer, got {value!r}")
            values[name] = value
        return cls(**values)
