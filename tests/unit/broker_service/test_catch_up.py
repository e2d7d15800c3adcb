"""A new leader's HW catching up (docs/replication.md, "Consumers across a failover"): while the HW is below
the start of the leader's epoch, a consumer's fetch above the HW and ListOffsets answer the retriable
OFFSET_NOT_AVAILABLE; once it caught up, both answer as before (an offset above the HW is an empty answer
that long-polls)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sluice.broker.fetch import PartitionRead, PartitionSpec
from sluice.broker.requests import FetchParams, OffsetQuery
from sluice.broker.service import BrokerService
from sluice.errors import OffsetNotAvailable

from .test_replication_core import F1, ME, _assign, _hw, _leader, _produce, _replica_fetch


async def _consume(service: BrokerService, offset: int) -> PartitionRead:
    read = await service.fetch(FetchParams(0, 1, 0, [PartitionSpec("t", 0, offset, 1 << 20)]))
    return read.partitions[0]


def test_offsets_above_a_new_leaders_hw_are_not_available_until_it_catches_up(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _leader(tmp_path, isr=(ME, F1))
        _produce(service, 4)  # acks=1: F1 has not fetched, the HW stays at 0
        assert _hw(service) == 0
        # Elected again in epoch 4 (as after a failover): its epoch starts at its log end, 4.
        await _assign(service, (ME, F1), version=2, epoch=4)
        latest = service.list_offsets([OffsetQuery("t", 0, -1)])[0]
        assert isinstance(latest.error, OffsetNotAvailable)
        by_time = service.list_offsets([OffsetQuery("t", 0, 0)])[0]
        assert isinstance(by_time.error, OffsetNotAvailable)
        above = await _consume(service, 2)
        assert isinstance(above.error, OffsetNotAvailable)
        assert above.error.retriable
        at_hw = await _consume(service, 0)
        assert at_hw.error is None
        # The follower fetches from the new leader: the HW passes the epoch start.
        await _replica_fetch(service, F1, 4, epoch=4)
        assert _hw(service) == 4
        assert service.list_offsets([OffsetQuery("t", 0, -1)])[0].offset == 4
        caught_up = await _consume(service, 2)
        assert caught_up.error is None
        assert caught_up.batches
        # Steady state: an offset above the HW within the log is an empty answer, as before.
        _produce(service, 2)
        steady = await _consume(service, 5)
        assert steady.error is None
        assert steady.batches == []
        await service.stop()

    asyncio.run(scenario())
