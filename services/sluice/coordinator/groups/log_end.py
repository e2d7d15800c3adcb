"""The log-end offsets (high watermarks) the lag computations read: one cache for every group.

Before, each group's lag refresh asked the brokers for the high watermarks of its own partitions: a
partition read by 50 groups was asked about 50 times per refresh, and every group ever seen was refreshed
(750 empty groups: 4% of a broker at idle). Now a refresh collects the partitions of every group it
refreshes and asks once per partition (one ``ListOffsets`` per broker, through the fetch function it is
given: ``LagReader.high_watermarks``); an answer younger than ``max_age_s`` is reused, by the next group,
by ``DescribeGroup`` or by the next refresh.

Its own module so that how the offsets are fetched (``lag.py``; the peer layer that will replace its
channel cache) and how long they are kept (here) change independently.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable

from sluice.coordinator.cluster.state import ClusterState

__all__ = ["FetchHighWatermarks", "LogEndCache"]

TopicPartition = tuple[str, int]
#: (cluster, partitions) -> high watermark of those whose broker answered.
FetchHighWatermarks = Callable[[ClusterState, Iterable[TopicPartition]], Awaitable[dict[TopicPartition, int]]]


class LogEndCache:
    def __init__(self, fetch: FetchHighWatermarks, clock: Callable[[], float] = time.monotonic) -> None:
        self._fetch = fetch
        self._clock = clock
        #: (topic, partition) -> (high watermark, when it was read).
        self._ends: dict[TopicPartition, tuple[int, float]] = {}
        #: Partitions asked of the brokers so far (bench and tests read it).
        self.fetched = 0

    async def get(
        self, cluster: ClusterState, partitions: Iterable[TopicPartition], max_age_s: float
    ) -> dict[TopicPartition, int]:
        """High watermarks of ``partitions``: those read within ``max_age_s`` from the cache, the others
        from the brokers in one call (a partition whose broker does not answer is left out: unknown)."""
        wanted = set(partitions)
        now = self._clock()
        stale = sorted(tp for tp in wanted if now - self._ends.get(tp, (0, -1e18))[1] > max_age_s)
        if stale:
            fresh = await self._fetch(cluster, stale)
            self.fetched += len(stale)
            for tp in stale:
                if tp in fresh:
                    self._ends[tp] = (fresh[tp], now)
                else:
                    self._ends.pop(tp, None)
        return {tp: self._ends[tp][0] for tp in wanted if tp in self._ends}

    def forget_older_than(self, age_s: float) -> None:
        """Drop what nobody asked about for ``age_s``: the cache holds only partitions being read."""
        oldest = self._clock() - age_s
        for tp in [tp for tp, (_, at) in self._ends.items() if at < oldest]:
            del self._ends[tp]

    def __len__(self) -> int:
        return len(self._ends)
