"""What an append and a read of a partition log return."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    append_time_ms: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    #: Whole stamped batches, raw from the segment files.
    data: bytes
    #: The offset after the last batch returned (the requested offset if none).
    next_offset: int
    #: Base offset of the first batch returned (it may start before the requested offset).
    base_offset_of_first: int
