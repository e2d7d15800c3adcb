"""Pure offset planning: ranges, splits and read limits. No I/O."""

from __future__ import annotations

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
