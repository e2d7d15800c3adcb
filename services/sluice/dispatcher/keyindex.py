"""Key_Shared read-ahead indexed by owning consumer, so a dispatch pass visits only what it can send.

Without it the Key_Shared pass scanned a partition's whole read-ahead at every pass and kept back, at
the cost of a Python step each, every message whose consumer had no capacity left (session 15's
profile: 1.6-3.2 M messages scanned per 100,000-record run, 90 % of them kept that way; the
read-ahead fills with the keys of the busy consumers, so the one with permits finds its few
messages only at the end). Here each message below the cursor's gate is filed once, when the pass
first meets it, under the owner of its key hash (``owner_table``); a pass then walks only the queues
of consumers with capacity, and stops in each as soon as that consumer's capacity is used up.

Invariants (``PartitionState.pending`` keeps the rest of the read-ahead):

- every filed message has a lower offset than every message still in ``pending`` (a prefix is filed),
  and each queue is in offset order, so per-key order holds (a key has one owner, so one queue);
- while parking is on, ``filed[hash]`` counts the messages of each hash filed here: a message of a
  parked key goes straight to parking only if none of its key is still filed (those went in before
  the key parked and wait for their owner's capacity; parking them behind a later one would put the
  key's dead letters out of order: ``bench/poison_keys.py`` caught it);
- a message is filed under ``owner_table[hash]`` as it was when filed: whenever the table changes
  (a consumer joins or leaves) or the gate may go down (truncation), :meth:`KeyedReadAhead.unfile`
  puts everything back at the front of ``pending``, in offset order, and the next pass files again.

Caller: ``selectors._KeySharedPass`` (filing, taking), ``Subscription`` (table changes),
``truncation``, ``parking`` (is a head still waiting here), ``PartitionState`` (counts, release).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import deque

from sluice.dispatcher.consumer import Consumer
from sluice.dispatcher.messages import Message, offset_of

__all__ = ["KeyedReadAhead"]


class KeyedReadAhead:
    """Filed read-ahead of one Key_Shared partition: ``queues[owner]`` in offset order (``None``: hashes
    nobody owns, which wait until a sticky consumer declares them)."""

    __slots__ = ("count", "filed", "queues")

    def __init__(self, count_hashes: bool) -> None:
        self.queues: dict[Consumer | None, deque[Message]] = {}
        #: Messages filed, over all queues.
        self.count = 0
        #: Parking on: messages filed per key hash (see the module's invariants); None otherwise.
        self.filed: dict[int, int] | None = {} if count_hashes else None

    def __len__(self) -> int:
        return self.count

    def file(self, m: Message, owner: Consumer | None) -> None:
        q = self.queues.get(owner)
        if q is None:
            q = self.queues[owner] = deque()
        q.append(m)
        self.count += 1
        filed = self.filed
        if filed is not None:
            h = m.key_hash
            filed[h] = filed.get(h, 0) + 1

    def gone(self, h: int) -> None:
        """A filed message of hash ``h`` left (sent, parked)."""
        self.count -= 1
        filed = self.filed
        if filed is not None:
            n = filed[h] - 1
            if n:
                filed[h] = n
            else:
                del filed[h]

    def unfile(self) -> list[Message]:
        """Empty the index: everything filed, in offset order (the caller puts it back in front)."""
        queues = [q for q in self.queues.values() if q]
        self.clear()
        if len(queues) == 1:
            return list(queues[0])
        return list(heapq.merge(*queues, key=offset_of))

    def holds(self, o: int) -> bool:
        """Whether offset ``o`` is filed here (one bisect per queue: a queue per consumer)."""
        for q in self.queues.values():
            if q and q[0].offset <= o <= q[-1].offset:
                at = bisect_left(q, o, key=offset_of)
                if at < len(q) and q[at].offset == o:
                    return True
        return False

    def clear(self) -> None:
        self.queues = {}
        self.count = 0
        if self.filed is not None:
            self.filed = {}
