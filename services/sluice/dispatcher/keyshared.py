"""Key_Shared hash ranges: which consumer owns which key hashes.

A key hashes into ``0..65535`` (CRC32 of the key, mod 65536: deterministic across processes, unlike
Python's ``hash``). Consumers own hash ranges in one of two modes:

- **auto-split** (Pulsar's ``HashRangeAutoSplitStickyKeyConsumerSelector``): the first consumer owns
  everything; a joining consumer takes the upper half of the largest range; a leaving consumer's range
  goes to the consumer owning the range just above it (or just below, for the last range).

  Worked example: A joins -> A owns [0, 65535]. B joins -> A [0, 32767], B [32768, 65535]. C joins ->
  the largest range is A's (ties: the lowest) -> A [0, 16383], C [16384, 32767], B [32768, 65535].
  C leaves -> its range goes to the owner above it, B: A [0, 16383], B [16384, 65535].

- **sticky**: each consumer declares inclusive ranges; overlapping another consumer's ranges is refused
  (``CONSUMER_BUSY``), and hashes nobody declared wait until somebody does.

Ownership only says who *may* receive a key. Whether a message may go out now also depends on the
"draining hashes" rule, which lives in the subscription (``subscription.py``): a hash with messages
still unacknowledged at a previous owner waits until those are acknowledged.
"""

from __future__ import annotations

import zlib
from bisect import bisect_left
from collections.abc import Sequence
from itertools import pairwise

from sluice.errors import ConsumerBusy, InvalidArgument

__all__ = ["HASH_SPACE", "AutoSplitRanges", "StickyRanges", "key_hash", "parse_sticky_ranges"]

HASH_SPACE = 65536


def key_hash(key: bytes | None) -> int:
    """The hash of a message key in ``0..65535``; keyless messages share the hash of ``b""``."""
    return zlib.crc32(key or b"") & 0xFFFF


def parse_sticky_ranges(flat: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """``[start0, end0, start1, end1, ...]`` (inclusive) -> sorted pairs; INVALID_ARGUMENT if malformed."""
    if not flat or len(flat) % 2:
        raise InvalidArgument(
            "key_shared_policy.ranges must hold inclusive [start, end] pairs for sticky mode, "
            f"got {len(flat)} values"
        )
    pairs = sorted((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))
    for s, e in pairs:
        if not 0 <= s <= e < HASH_SPACE:
            raise InvalidArgument(f"sticky hash range [{s}, {e}] must satisfy 0 <= start <= end <= 65535")
    for (_, e1), (s2, e2) in pairwise(pairs):
        if s2 <= e1:
            raise InvalidArgument(f"sticky hash ranges overlap at [{s2}, {e2}]")
    return tuple(pairs)


class AutoSplitRanges:
    """Auto-split ownership: a sorted list of range ends (inclusive) with their owners."""

    __slots__ = ("_ends", "_owners")

    def __init__(self) -> None:
        self._ends: list[int] = []
        self._owners: list[str] = []

    def ranges(self) -> list[tuple[int, int, str]]:
        out = []
        start = 0
        for end, owner in zip(self._ends, self._owners, strict=True):
            out.append((start, end, owner))
            start = end + 1
        return out

    def add(self, consumer_id: str) -> None:
        if consumer_id in self._owners:
            return
        if not self._ends:
            self._ends, self._owners = [HASH_SPACE - 1], [consumer_id]
            return
        # The largest range (the lowest on ties) gives up its upper half.
        best, best_size, start = 0, -1, 0
        for i, end in enumerate(self._ends):
            size = end - start + 1
            if size > best_size:
                best, best_size = i, size
            start = end + 1
        if best_size < 2:
            raise ConsumerBusy("no Key_Shared hash range left to split: too many consumers")
        range_start = self._ends[best - 1] + 1 if best else 0
        mid = range_start + best_size // 2 - 1
        self._ends.insert(best, mid)
        self._owners.insert(best + 1, consumer_id)

    def remove(self, consumer_id: str) -> None:
        for i, owner in enumerate(self._owners):
            if owner != consumer_id:
                continue
            if len(self._owners) == 1:
                self._ends, self._owners = [], []
            elif i + 1 < len(self._owners):  # merge into the range above
                del self._ends[i]
                del self._owners[i]
            else:  # the last range merges into the one below
                del self._ends[i - 1]
                del self._owners[i]
            return

    def owner_table(self) -> list[str | None]:
        """``table[hash]`` -> owner id, for O(1) lookups per message."""
        table: list[str | None] = [None] * HASH_SPACE
        start = 0
        for end, owner in zip(self._ends, self._owners, strict=True):
            table[start : end + 1] = [owner] * (end - start + 1)
            start = end + 1
        return table


class StickyRanges:
    """Sticky ownership: every consumer's declared inclusive ranges, never overlapping."""

    __slots__ = ("_ranges",)

    def __init__(self) -> None:
        self._ranges: dict[str, tuple[tuple[int, int], ...]] = {}

    def ranges(self) -> list[tuple[int, int, str]]:
        return sorted((s, e, c) for c, rs in self._ranges.items() for s, e in rs)

    def add(self, consumer_id: str, ranges: tuple[tuple[int, int], ...]) -> None:
        taken = sorted((s, e, c) for c, rs in self._ranges.items() if c != consumer_id for s, e in rs)
        starts = [s for s, _, _ in taken]
        for s, e in ranges:
            i = bisect_left(starts, s)
            for s2, e2, other in taken[max(i - 1, 0) : i + 1]:
                if s <= e2 and s2 <= e:
                    raise ConsumerBusy(
                        f"sticky hash range [{s}, {e}] overlaps [{s2}, {e2}] of consumer {other!r}"
                    )
            # A range may also swallow several later ranges entirely.
            for s2, e2, other in taken[i:]:
                if s2 > e:
                    break
                raise ConsumerBusy(
                    f"sticky hash range [{s}, {e}] overlaps [{s2}, {e2}] of consumer {other!r}"
                )
        self._ranges[consumer_id] = ranges

    def remove(self, consumer_id: str) -> None:
        self._ranges.pop(consumer_id, None)

    def owner_table(self) -> list[str | None]:
        table: list[str | None] = [None] * HASH_SPACE
        for consumer_id, rs in self._ranges.items():
            for s, e in rs:
                table[s : e + 1] = [consumer_id] * (e - s + 1)
        return table
