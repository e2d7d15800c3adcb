"""A session's unacked ids, and the consumer's ack count, kept without the consumer's lock.

``ack()`` runs once per message on the application's thread. Taking the consumer's Condition for
it (to test and remove the id, and count it) cost about 0.55 µs of the ack's 1 µs: ``Condition``'s
``__enter__``/``__exit__`` are Python methods. Instead each removal is ONE C call that tests and
removes at once (``dict.pop(key, None)``), which the GIL makes atomic: of two threads acking the same
message, exactly one gets the id back, so an ack still leaves once and is counted once
(docs/push-consumer.md, "Acks without the consumer's lock"). That is why the ids are a dict (every
value ``True``) and not a set: ``set.discard`` does not say whether it removed anything, and
``set.remove`` raises (an exception per stale ack). Many ids are removed with ``map`` over the same
call and ``compress`` keeps those this caller removed, with no Python step per id.

Adding ids stays under the consumer's lock (``_take_many_locked``): a message is in the set before
the application can see it, so no ack can come before its add.
"""

from __future__ import annotations

import functools
import itertools
from collections import deque
from collections.abc import Iterable
from itertools import compress, repeat

from sluice.client.push.outbound import AckKey

__all__ = ["AckCounter", "Unacked", "add_ids", "discard_ids", "pop_id", "pop_ids"]

#: ``(partition, offset, leader epoch)`` -> True, for the ids taken and not acked or nacked yet.
Unacked = dict[AckKey, bool]


def add_ids(unacked: Unacked, ids: Iterable[AckKey]) -> None:
    unacked.update(zip(ids, repeat(True)))


def pop_id(unacked: Unacked, key: AckKey) -> bool:
    """Remove ``key``; True when this call removed it (False: not unacked, or another thread won)."""
    return unacked.pop(key, None) is not None


def pop_ids(unacked: Unacked, keys: list[AckKey]) -> list[AckKey]:
    """Remove ``keys``; those this call removed (each one atomic: concurrent callers split them)."""
    return list(compress(keys, map(unacked.pop, keys, repeat(None))))


def discard_ids(unacked: Unacked, keys: Iterable[AckKey]) -> None:
    deque(map(unacked.pop, keys, repeat(None)), maxlen=0)


class AckCounter:
    """A count bumped from any thread without a lock: ``itertools.count``'s ``next`` is one C call
    (atomic under the GIL), where ``n += 1`` is a read and a write another thread can come between.

    ``value()`` reads it by taking a number too, so it is called under the consumer's lock (one reader
    at a time) and subtracts the numbers the reads took."""

    __slots__ = ("_count", "_reads", "bump")

    def __init__(self) -> None:
        self._count = itertools.count()
        self._reads = 0
        #: Count one: a C-level callable (no Python frame on the ack's path).
        self.bump = functools.partial(next, self._count)

    def value(self) -> int:
        """The bumps so far. Caller: one thread at a time (the consumer's lock)."""
        n = next(self._count) - self._reads
        self._reads += 1
        return n
