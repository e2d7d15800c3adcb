"""Choosing a partition for a record.

Keyed records: ``zlib.crc32(key) % partitions`` (the IEEE CRC-32 of the key
bytes, as an unsigned 32-bit number). It is deterministic across processes,
machines and Python versions, so the same key always lands on the same partition
of a topic while the partition count stays the same, and it costs one C call.
Any other SDK reproduces it with a standard CRC-32.

Keyless records: the *sticky* partitioner (Kafka's KIP-480) keeps sending to one
partition until that partition's batch is closed (full, or sent because its
linger expired), then moves to another partition, chosen at random among those
with nothing queued or in flight when there is one (the point of Kafka's
KIP-794: records sent to a busy partition wait behind its batch, since a
partition has one request in flight at a time). Batches stay large, and over
time the load spreads evenly. ``round_robin`` rotates partition
by partition instead (smaller batches; for tests and special cases).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

__all__ = ["Partitioner", "RoundRobinPartitioner", "StickyPartitioner", "key_partition", "make_partitioner"]


# How many partitions the sticky partitioner looks at for an idle one when it moves on.
_IDLE_PROBES = 8


def key_partition(key: bytes, partitions: int) -> int:
    """The partition of a keyed record: ``zlib.crc32(key) % partitions``."""
    return zlib.crc32(key) % partitions


class Partitioner:
    """Chooses partitions for keyless records. Keyed records always use :func:`key_partition`.

    Caller: the producer (``keyless``, on every keyless send) and the accumulator
    (``on_batch_closed``, with the producer lock held).
    """

    __slots__ = ("partitions",)

    def __init__(self, partitions: int) -> None:
        if partitions < 1:
            raise ValueError("a topic has at least one partition")
        self.partitions = partitions

    def keyless(self) -> int:
        raise NotImplementedError

    def on_batch_closed(self, partition: int, busy: Callable[[int], bool]) -> None:
        """A batch of ``partition`` was closed; sticky partitioners move on.

        ``busy(p)``: partition ``p`` has a batch queued or in flight now."""


class StickyPartitioner(Partitioner):
    """Keyless records stick to one partition until its batch closes."""

    __slots__ = ("_current", "_rng")

    def __init__(self, partitions: int, rng: random.Random | None = None) -> None:
        super().__init__(partitions)
        self._rng = rng or random.Random()
        self._current = self._rng.randrange(partitions)

    def keyless(self) -> int:
        return self._current

    def on_batch_closed(self, partition: int, busy: Callable[[int], bool]) -> None:
        # Only the sticky partition's own batch moves it; a keyed batch closing elsewhere does not.
        if partition != self._current or self.partitions == 1:
            return
        others = self.partitions - 1
        start = self._rng.randrange(others)
        # From a random start, the first idle partition among the next few: O(1) per batch
        # however many partitions the topic has, and random when every probed one is busy.
        for step in range(min(others, _IDLE_PROBES)):
            nxt = (start + step) % others
            candidate = nxt if nxt < partition else nxt + 1
            if not busy(candidate):
                self._current = candidate
                return
        self._current = start if start < partition else start + 1


class RoundRobinPartitioner(Partitioner):
    """Keyless records go to partitions 0, 1, 2, ... in turn."""

    __slots__ = ("_next",)

    def __init__(self, partitions: int) -> None:
        super().__init__(partitions)
        self._next = 0

    def keyless(self) -> int:
        p = self._next
        self._next = (p + 1) % self.partitions
        return p


def make_partitioner(name: str, partitions: int) -> Partitioner:
    """The partitioner called ``name`` (``ProducerConfig.partitioner``)."""
    if name == "default":
        return StickyPartitioner(partitions)
    if name == "round_robin":
        return RoundRobinPartitioner(partitions)
    raise ValueError(f"unknown partitioner {name!r}")
