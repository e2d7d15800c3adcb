"""The dispatcher's partition feeds: one per (topic, partition) this dispatcher reads, shared by every
loaded subscription of that partition, started with the first and stopped after the last.
Caller: ``DispatcherService`` (load and drop); ``describe.py`` reads ``feeds`` for high watermarks.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from sluice.common.peers import AioPeers
from sluice.dispatcher.cluster import CoordinatorLink
from sluice.dispatcher.config import DispatcherConfig, ms
from sluice.dispatcher.feed import FeedTarget, PartitionFeed

__all__ = ["FeedKey", "FeedSet"]

FeedKey = tuple[str, int]


class FeedSet:
    def __init__(self, config: DispatcherConfig, link: CoordinatorLink, channels: AioPeers) -> None:
        self._config = config
        self._link = link
        self._channels = channels
        self.feeds: dict[FeedKey, PartitionFeed] = {}
        self._targets: dict[FeedKey, list[FeedTarget]] = defaultdict(list)

    def attach(self, topic: str, partition: int, target: FeedTarget) -> None:
        """``target`` reads ``partition`` of ``topic``: start its feed if it is the first."""
        key = (topic, partition)
        self._targets[key].append(target)
        feed = self.feeds.get(key)
        if feed is None:
            targets = self._targets[key]

            def current() -> list[FeedTarget]:
                return list(targets)

            cfg = self._config
            feed = PartitionFeed(
                topic,
                partition,
                self._link,
                self._channels,
                current,
                ms(cfg.fetch_max_wait),
                cfg.fetch_max_bytes,
            )
            self.feeds[key] = feed
            feed.start()
        target.follow_epochs(partition, feed.epochs.trail)
        feed.kick()

    async def detach(self, topic: str, partitions: Iterable[int], target: FeedTarget) -> None:
        """``target`` stops reading these partitions: stop the feeds nobody else reads."""
        for p in list(partitions):
            key = (topic, p)
            targets = self._targets.get(key)
            if targets is not None and target in targets:
                targets.remove(target)
            if not targets:
                self._targets.pop(key, None)
                feed = self.feeds.pop(key, None)
                if feed is not None:
                    await feed.stop()
