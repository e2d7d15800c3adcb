"""One timer heap per subscription (nack delays, ack timeouts): no asyncio task or timer per message.

Pure: deadlines are integers in milliseconds of whatever clock the caller passes in. The service
arms one ``loop.call_at`` for :meth:`TimerHeap.next_due` and calls :meth:`pop_due` when it fires.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["TimerHeap"]


class TimerHeap(Generic[T]):
    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, T]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, due_ms: int, item: T) -> None:
        heapq.heappush(self._heap, (due_ms, next(self._seq), item))

    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> list[T]:
        """Every item due at or before ``now_ms``, in deadline order."""
        heap = self._heap
        out: list[T] = []
        while heap and heap[0][0] <= now_ms:
            out.append(heapq.heappop(heap)[2])
        return out

    def clear(self) -> None:
        self._heap.clear()
