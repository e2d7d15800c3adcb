"""The asyncio low-level fetcher: the sync :class:`~sluice.client.fetcher.Fetcher`, awaited.

Manual assignment without a group (aiokafka's ``assign()``): read given partitions from given offsets,
``seek`` and ``remove`` them, change a topic's filter. ``client.fetcher(...)`` takes the sync
``fetcher()``'s arguments::

    async with client.fetcher({("orders", 0): 0}) as fetcher:
        records = await fetcher.fetch(timeout=1.0)

Each ``fetch`` is the sync ``fetch()`` run in a worker thread, one at a time (``Serial``): the sync
fetcher has one fetching thread, and its fetch takes records as it reads them. So a ``fetch`` whose
awaiting task is cancelled still runs to its end, and what it took is kept and returned first by the
next ``fetch`` (as the parking consumer's poll is, docs/asyncio.md, "Cancellation"): no record is lost.
``positions()`` counts those kept records as not yet consumed. ``seek``, ``remove`` and ``set_filter``
change the fetcher's state, so they wait for a fetch in progress (awaited); ``seek`` and ``remove`` drop
the kept records of their partition, as the sync ``seek`` discards an answer in flight.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.aio.bridge import Serial
from sluice.client.fetcher import Fetcher as SyncFetcher
from sluice.codec.batch import Record

__all__ = ["Fetcher"]

TopicPartition = tuple[str, int]


class Fetcher:
    """Reads partitions from offsets, without a group, for asyncio. Made by
    ``sluice.aio.Client.fetcher``."""

    def __init__(self, sync: SyncFetcher) -> None:
        self._sync = sync
        self._serial = Serial()
        #: Records a cancelled fetch took: the next fetch returns them first.
        self._kept: list[Record] = []

    @property
    def sync(self) -> SyncFetcher:
        return self._sync

    @property
    def truncations(self) -> int:
        return self._sync.truncations

    async def fetch(self, timeout: float | None = None) -> list[Record]:  # noqa: ASYNC109
        """Records from the current positions, advancing them; ``timeout`` as the sync ``fetch()``'s
        (None: one round). Cancelling it loses no record."""
        await self._serial.acquire()
        try:
            if self._kept:
                kept, self._kept = self._kept, []
                return kept
            return await self._serial.in_thread(self._sync.fetch, timeout, orphan=self._keep)
        finally:
            self._serial.release()

    def _keep(self, records: list[Record]) -> None:
        self._kept += records

    def positions(self) -> dict[TopicPartition, int]:
        """The next offset to hand out of every partition (a kept record's, if any)."""
        out = self._sync.positions()
        for record in reversed(self._kept):  # the first kept record of a partition wins
            out[(record.topic, record.partition)] = record.offset
        return out

    def highwater(self, tp: TopicPartition) -> int | None:
        return self._sync.highwater(tp)

    async def seek(self, tp: TopicPartition, offset: int, leader_epoch: int = -1) -> None:
        """The sync ``seek()``, once a fetch in progress has ended."""
        await self._serial.inline(self._drop_then, self._sync.seek, tp, offset, leader_epoch)

    async def remove(self, tp: TopicPartition) -> None:
        """Stop fetching ``tp`` (the sync ``remove()``), once a fetch in progress has ended."""
        await self._serial.inline(self._drop_then, self._sync.remove, tp)

    def _drop_then(self, change: Callable[..., None], tp: TopicPartition, *args: int) -> None:
        self._kept = [r for r in self._kept if (r.topic, r.partition) != tp]
        change(tp, *args)

    async def set_filter(self, topic: str, expression: str | None) -> None:
        """The sync ``set_filter()``, once a fetch in progress has ended."""
        await self._serial.inline(self._sync.set_filter, topic, expression)

    async def close(self) -> None:
        """Waits for a fetch in progress (at most its ``timeout``, or one round), then closes."""
        await self._serial.run(self._sync.close)

    async def __aenter__(self) -> Fetcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<aio Fetcher positions={self.positions()!r}>"
