"""A compact set of acknowledged offsets: sorted half-open ranges in one ``array('q')``.

A subscription acknowledges individually, so above its mark-delete position the acked offsets form
ranges with holes between them. Memory must grow with the number of holes, not with the backlog: one
range costs two int64 bounds (16 bytes) in a flat array, where a Python ``set`` of ints would cost
about 60 bytes per *offset*. Every other message of 1,000,000 acked is 500,000 ranges, 8 MB.

The flat layout ``[start0, end0, start1, end1, ...]`` (ends exclusive, sorted, non-adjacent) is also
the wire and persisted layout (``sluice.v1.Cursor.acked_ranges``, ``offsetstore.cursor_codec``), so
converting at the boundary is a copy, not a transformation.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

__all__ = ["AckRanges", "CountRanges", "runs"]


def runs(sorted_offsets: Iterable[int]) -> Iterator[tuple[int, int]]:
    """Group sorted, distinct offsets into maximal ``[start, end)`` runs.

    >>> list(runs([1, 2, 3, 7, 9, 10]))
    [(1, 4), (7, 8), (9, 11)]
    """
    start = end = -1
    for o in sorted_offsets:
        if o == end:
            end += 1
            continue
        if end > start:
            yield start, end
        start, end = o, o + 1
    if end > start:
        yield start, end


class AckRanges:
    """Sorted, disjoint, non-adjacent ``[start, end)`` ranges of offsets.

    Caller: ``cursor.PartitionCursor``. Adding at the end (the common case: acks arrive roughly in
    order) appends to the array; adding in the middle shifts its tail (a C ``memmove``).
    """

    __slots__ = ("_b",)

    def __init__(self, flat: Iterable[int] = ()) -> None:
        self._b: array[int] = array("q", flat)
        if len(self._b) % 2:
            raise ValueError("acked ranges need an even number of bounds")

    def __len__(self) -> int:
        """The number of ranges (holes + 1, roughly)."""
        return len(self._b) // 2

    def __bool__(self) -> bool:
        return bool(self._b)

    def __contains__(self, offset: int) -> bool:
        b = self._b
        if not b or offset >= b[-1] or offset < b[0]:
            return False
        return bisect_right(b, offset) % 2 == 1

    @property
    def flat(self) -> array[int]:
        """The bounds ``[s0, e0, s1, e1, ...]`` (the live array; copy before keeping it)."""
        return self._b

    @property
    def first_start(self) -> int:
        """The start of the first range; only valid when the set is not empty."""
        return self._b[0]

    @property
    def last_end(self) -> int:
        return self._b[-1] if self._b else -1

    def count(self) -> int:
        """How many offsets the ranges hold."""
        b = self._b
        return sum(b[1::2]) - sum(b[0::2])

    def nbytes(self) -> int:
        """Bytes of range storage (the array's items; its over-allocation is small)."""
        return self._b.buffer_info()[1] * self._b.itemsize

    def add(self, start: int, end: int) -> None:
        """Add ``[start, end)``, merging with overlapping or adjacent ranges."""
        if end <= start:
            return
        b = self._b
        if not b or start > b[-1]:
            b.append(start)
            b.append(end)
            return
        if start == b[-1]:
            b[-1] = max(b[-1], end)
            return
        i = bisect_left(b, start)
        if i % 2:  # start falls inside (or at the end of) range i // 2
            i -= 1
            start = b[i]
        j = bisect_right(b, end)
        if j % 2:  # end falls inside (or at the start of) a range: extend to its end
            end = b[j]
            j += 1
        b[i:j] = array("q", (start, end))

    def pop_below(self, position: int) -> int:
        """Drop everything below ``position``; if a range covers ``position`` return its end.

        Caller: the cursor when its mark-delete moves: the range that now touches the mark-delete is
        absorbed into it. Returns the new mark-delete (``position`` or further).
        """
        b = self._b
        if not b or b[0] > position:
            return position
        k = bisect_right(b, position)
        if k % 2:  # position inside range (k-1)//2 ... its end is b[k]
            position = b[k]
            k += 1
        del b[:k]
        return position

    def remove_from(self, position: int) -> None:
        """Drop every offset at or above ``position`` (a reset backwards)."""
        b = self._b
        k = bisect_left(b, position)
        if k % 2:
            b[k] = position
            k += 1
        del b[k:]

    def next_gap(self, offset: int) -> int:
        """The first offset ``>= offset`` that is not in the set."""
        b = self._b
        if not b or offset >= b[-1] or offset < b[0]:
            return offset
        k = bisect_right(b, offset)
        return b[k] if k % 2 else offset


class CountRanges:
    """Redelivery counts by range: ``[start, end) -> count``, sorted, disjoint, counts >= 1.

    Caller: ``cursor.PartitionCursor``, for what a crash leaves behind. After a ``kill -9`` every
    unacknowledged offset below the persisted "delivered up to" mark may have been delivered once
    more than its persisted count says, so recovery adds 1 over that whole window: one range per
    crash instead of one entry per message (a window of 1,000,000 in-flight messages is 24 bytes).
    Ranges only split where a later window starts or ends inside an earlier one, so a subscription
    that crashes k times without progress holds at most ``2k + 1`` ranges.

    Flat layout ``[start0, end0, count0, start1, ...]`` in one ``array('q')``, which is also the
    persisted layout (``sluice.v1.Cursor.redelivery_ranges``).
    """

    __slots__ = ("_t",)

    def __init__(self, flat: Iterable[int] = ()) -> None:
        t = array("q", flat)
        if len(t) % 3:
            raise ValueError(f"redelivery ranges need [start, end, count] triples, got {len(t)} values")
        for i in range(0, len(t), 3):
            if t[i] >= t[i + 1] or t[i + 2] < 1 or (i and t[i] < t[i - 2]):
                raise ValueError(f"redelivery range {i // 3} [{t[i]}, {t[i + 1]}) x{t[i + 2]} is invalid")
        self._t = t

    def __len__(self) -> int:
        return len(self._t) // 3

    def __bool__(self) -> bool:
        return bool(self._t)

    @property
    def flat(self) -> array[int]:
        """``[s0, e0, c0, s1, e1, c1, ...]`` (the live array; copy before keeping it)."""
        return self._t

    @property
    def end(self) -> int:
        """The end of the last range (every offset at or above it has count 0 here)."""
        return self._t[-2] if self._t else 0

    def count_at(self, offset: int) -> int:
        t = self._t
        if not t or offset >= t[-2] or offset < t[0]:
            return 0
        # Bisect on the starts: the last range starting at or before ``offset``.
        lo, hi = 0, len(t) // 3
        while lo < hi:
            mid = (lo + hi) // 2
            if t[3 * mid] <= offset:
                lo = mid + 1
            else:
                hi = mid
        i = 3 * (lo - 1)
        return t[i + 2] if offset < t[i + 1] else 0

    def add_one(self, start: int, end: int) -> None:
        """Add 1 to the count of every offset in ``[start, end)`` (0 becomes 1)."""
        if end <= start:
            return
        out: list[tuple[int, int, int]] = []
        pos = start
        t = self._t
        for i in range(0, len(t), 3):
            s, e, c = t[i], t[i + 1], t[i + 2]
            if e <= start or s >= end:
                out.append((s, e, c))
                continue
            if s < start:
                out.append((s, start, c))
            lo, hi = max(s, start), min(e, end)
            if pos < lo:
                out.append((pos, lo, 1))
            out.append((lo, hi, c + 1))
            pos = hi
            if e > end:
                out.append((end, e, c))
        if pos < end:
            out.append((pos, end, 1))
        out.sort()
        merged: list[int] = []
        for s, e, c in out:
            if merged and merged[-2] == s and merged[-1] == c:
                merged[-2] = e
            else:
                merged += (s, e, c)
        self._t = array("q", merged)

    def trim_from(self, position: int) -> None:
        """Forget counts at or above ``position`` (a truncated log: those offsets hold new records)."""
        t = self._t
        k = 0
        while k < len(t) and t[k + 1] <= position:
            k += 3
        if k < len(t) and t[k] < position:
            t[k + 1] = position
            k += 3
        del t[k:]

    def trim_below(self, position: int) -> None:
        """Forget counts below ``position`` (acknowledged: nobody will ask again)."""
        t = self._t
        if not t or t[0] >= position:
            return
        k = 0
        while k < len(t) and t[k + 1] <= position:
            k += 3
        del t[:k]
        if t and t[0] < position:
            t[0] = position
