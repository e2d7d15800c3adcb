"""The service layer in-process over real logs: group commit, shutdown with parked fetches."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment
from sluice.broker.config import BrokerConfig
from sluice.broker.fetch import PartitionSpec
from sluice.broker.log.manager import LogManager
from sluice.broker.service import BrokerService, FetchParams, ProduceItem
from sluice.errors import BrokerNotAvailable

from .helpers import batch, values


async def _service(data: Path, flush: str) -> BrokerService:
    config = BrokerConfig(data_dir=data, flush=flush)
    logs = LogManager(data, config.log_defaults())
    logs.open_all()
    service = BrokerService(config, logs)
    await service.start()
    await service.update_partitions(
        AssignmentUpdate(0, False, tuple(PartitionAssignment("t", "id", p) for p in range(2)))
    )
    return service


def test_concurrent_produces_share_fsyncs_under_flush_always(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _service(tmp_path, "always")
        produces = [
            service.produce(1, 0, [ProduceItem("t", i % 2, batch(values(3, f"p{i}-")))]) for i in range(40)
        ]
        results = await asyncio.gather(*produces)
        assert all(r[0].error is None for r in results)
        assert sorted(r[0].base_offset for r in results if r[0].partition == 0) == list(range(0, 60, 3))
        # Group commit: far fewer fsync rounds than acknowledged produce requests.
        assert 1 <= service.flusher.rounds < 20
        await service.stop()

    asyncio.run(scenario())


def test_stop_answers_parked_fetches_and_refuses_new_requests(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _service(tmp_path, "interval")
        params = FetchParams(5000, 1, 0, [PartitionSpec("t", 0, 0, 0)])
        started = time.monotonic()
        parked = asyncio.create_task(service.fetch(params))
        await asyncio.sleep(0.05)
        assert not parked.done()
        assert len(service.waiters) == 1
        await service.stop()
        outcome = await parked
        assert time.monotonic() - started < 2
        assert outcome.partitions[0].position == 0
        with pytest.raises(BrokerNotAvailable):
            await service.produce(1, 0, [ProduceItem("t", 0, batch(values(1)))])

    asyncio.run(scenario())
