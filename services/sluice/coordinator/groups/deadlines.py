"""Which groups have something due, without looking at every group. Pure: no I/O, no clock.

Two structures the group timer reads instead of scanning every group it has ever seen:

- :class:`Deadlines`, a heap of (due time, group): when the offsets retention expires a group's oldest
  idle binding, or the whole group once it is empty. The timer pops only what is due, so 10,000 empty
  groups cost nothing between their deadlines (they used to cost a pass over all of them 20 times a
  second).
- the *live* groups (with members): sessions, rebalance deadlines, throttled assignments and topic
  changes concern only them. ``GroupsBase.live`` keeps them, updated at replay.

Entries are lazily invalidated: every change of a group's deadline pushes a new entry and remembers the
current one; a popped entry that is not the group's current deadline is dropped. The heap is rebuilt
when stale entries outnumber live ones, so churn cannot grow it without bound.
"""

from __future__ import annotations

import heapq

__all__ = ["Deadlines"]

#: Rebuild the heap once it holds this many more entries than there are groups with a deadline.
_SLACK = 1024


class Deadlines:
    def __init__(self) -> None:
        self._heap: list[tuple[int, str]] = []
        self._at: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._at)

    def set(self, name: str, at_ms: int | None) -> bool:
        """``name`` is due at ``at_ms`` (None: nothing due). Returns whether the earliest deadline of all
        moved earlier (the caller's timer may have to wake sooner)."""
        current = self._at.get(name)
        if at_ms == current:
            return False
        if at_ms is None:
            del self._at[name]
            return False
        earlier = not self._heap or at_ms < self._heap[0][0]
        self._at[name] = at_ms
        heapq.heappush(self._heap, (at_ms, name))
        if len(self._heap) > 2 * len(self._at) + _SLACK:
            self._heap = [(at, n) for n, at in self._at.items()]
            heapq.heapify(self._heap)
        return earlier

    def next_at(self) -> int | None:
        """The earliest deadline (stale entries at the top are dropped first)."""
        while self._heap and self._at.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int, limit: int) -> list[str]:
        """Up to ``limit`` groups whose deadline is ``now_ms`` or earlier, earliest first. Their deadlines
        are consumed: whatever the caller writes about them sets the next one (at replay)."""
        out: list[str] = []
        while len(out) < limit:
            at = self.next_at()
            if at is None or at > now_ms:
                break
            _, name = heapq.heappop(self._heap)
            del self._at[name]
            out.append(name)
        return out

    def at(self, name: str) -> int | None:
        return self._at.get(name)
