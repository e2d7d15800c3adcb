"""Pure offset planning: ranges, splits and read limits. No I/O."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class OffsetRange:
    """Records [start, end) of one topic-partition: one Spark input partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split(r: OffsetRange, max_records: int | None) -> list[OffsetRange]:
    """Split a range into pieces of at most ``max_records`` (None: no split).

    >>> [(x.start, x.end) for x in split(OffsetRange("t", 0, 0, 10), 4)]
    [(0, 4), (4, 8), (8, 10)]
    """
    if r.size <= 0:
        return []
    if max_records is None or r.size <= max_records:
        return [r]
    return [
        OffsetRange(r.topic, r.partition, s, min(s + max_records, r.end))
        for s in range(r.start, r.end, max_records)
    ]


def split_min_partitions(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """At least ``min_partitions`` pieces when there are that many records: each range gets a share
    of ``min_partitions`` in proportion to its size, rounded *up* (Kafka's source rounds to nearest,
    so its count is only approximately the minimum), and is cut into that many near-equal pieces.
    Small ranges are never merged (a Spark partition reads one topic-partition).

    >>> [(x.start, x.end) for x in split_min_partitions([OffsetRange("t", 0, 0, 10)], 3)]
    [(0, 3), (3, 6), (6, 10)]
    """
    live = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in live)
    if min_partitions is None or len(live) >= min_partitions or total == 0:
        return live
    out: list[OffsetRange] = []
    for r in live:
        parts = min(r.size, -(-r.size * min_partitions // total))  # ceil, >= 1 as size > 0
        bounds = [r.start + r.size * i // parts for i in range(parts + 1)]
        out += [OffsetRange(r.topic, r.partition, a, b) for a, b in itertools.pairwise(bounds)]
    return out


def limit_offsets(
    start: Mapping[str, int], latest: Mapping[str, int], max_records: int | None
) -> dict[str, int]:
    """The end offsets of a micro-batch holding at most ``max_records`` records.

    The budget is shared in proportion to each partition's backlog (as Kafka's
    source does), rounding down, then the remainder goes one record at a time
    to partitions in key order so the total is exact and deterministic.

    >>> limit_offsets({"t/0": 0, "t/1": 0}, {"t/0": 30, "t/1": 10}, 8)
    {'t/0': 6, 't/1': 2}
    """
    backlog = {k: max(0, latest[k] - start.get(k, latest[k])) for k in latest}
    total = sum(backlog.values())
    if max_records is None or total <= max_records:
        return dict(latest)
    take = {k: backlog[k] * max_records // total for k in backlog}
    left = max_records - sum(take.values())
    for k in sorted(backlog):
        if left == 0:
            break
        if take[k] < backlog[k]:
            take[k] += 1
            left -= 1
    return {k: start.get(k, latest[k]) + take[k] for k in latest}
