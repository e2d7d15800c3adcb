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

__all__ = ["AckRanges", "runs"]


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
