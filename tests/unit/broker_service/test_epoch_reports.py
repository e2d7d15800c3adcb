"""What a broker reports to a controller that is behind it (docs/replication.md, "Controller state that
cannot roll back"): a partition whose assignment came at epochs older than the broker's marks is reported,
with the leader, replicas and ISR the broker knows (its own leader state when it leads, its assignment when
it follows), until the controller sends it newer epochs. Nothing is reported in the steady state."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment
from sluice.broker.config import BrokerConfig
from sluice.broker.epoch_reports import epoch_reports
from sluice.broker.log.manager import LogManager
from sluice.broker.service import BrokerService

ME, F1, F2 = 0, 1, 2


async def _service(data: Path) -> BrokerService:
    config = BrokerConfig(data_dir=data, flush="never", broker_id=ME)
    logs = LogManager(data, config.log_defaults())
    logs.open_all()
    service = BrokerService(config, logs)
    await service.start()
    return service


async def _assign(
    service: BrokerService, version: int, leader: int, epochs: tuple[int, int], isr: tuple[int, ...]
) -> None:
    item = PartitionAssignment(
        "t", "tid", 0, leader=leader, leader_epoch=epochs[0], partition_epoch=epochs[1],
        replicas=(ME, F1, F2), isr=isr, min_insync_replicas=2,
    )  # fmt: skip
    await service.update_partitions(AssignmentUpdate(version, True, (item,)))


def _reports(service: BrokerService) -> list[tuple[int, int, int, list[int], list[int]]]:
    return [
        (r.leader_epoch, r.partition_epoch, r.leader, list(r.replicas), list(r.isr))
        for r in epoch_reports(service.registry, service.leaders, ME)
    ]


def test_a_leader_reports_its_state_while_the_controller_is_behind(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _service(tmp_path)
        await _assign(service, 1, ME, (2, 3), (ME, F1))
        assert _reports(service) == []  # steady state: nothing
        # A controller whose Redis lost those changes sends epochs (0, 0): ignored, and reported.
        await _assign(service, 2, F1, (0, 0), (ME, F1, F2))
        assert _reports(service) == [(2, 3, ME, [ME, F1, F2], [ME, F1])]
        assert ("t", 0) in service.registry.served  # it keeps leading meanwhile
        # The controller takes the report and sends epochs above it: nothing more to report.
        await _assign(service, 3, ME, (3, 4), (ME, F1))
        assert _reports(service) == []
        await service.stop()

    asyncio.run(scenario())


def test_a_follower_reports_the_leader_and_isr_of_its_assignment(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _service(tmp_path)
        await _assign(service, 1, F1, (1, 1), (F1, ME))
        await _assign(service, 2, ME, (0, 0), (ME, F1, F2))  # behind: would make this broker leader
        assert _reports(service) == [(1, 1, F1, [ME, F1, F2], [F1, ME])]
        await service.stop()

    asyncio.run(scenario())
