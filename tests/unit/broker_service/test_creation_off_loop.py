"""Creating many partitions does not hold the broker's event loop (issue 20).

An UpdatePartitions that creates 1,000 logs is directories, ``partition.json`` and fsyncs per log:
~6.5 s of the event loop when it ran there, during which produces and fetches on the partitions the
broker already served waited. The file work now runs in a worker thread (``update_runner.py``), while
the served set, the roles, the epochs and the leader states change on the loop, before it (what the
update unserves and deletes) or after it (everything else, journaled before the answer). These tests
check the order of events, not times.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment
from sluice.broker.config import BrokerConfig
from sluice.broker.log.manager import LogManager
from sluice.broker.roles import EpochMark
from sluice.broker.service import BrokerService, ProduceItem

from .helpers import batch, values

CREATED = 1_000
#: Enough for several trips to the worker thread (64 logs each), for the tests of what happens around them.
SEVERAL_CHUNKS = 300
ME, OTHER = 0, 1


def _assign(topic: str, count: int, version: int = 0, **replica: Any) -> AssignmentUpdate:
    items = tuple(PartitionAssignment(topic, f"{topic}-id", p, **replica) for p in range(count))
    return AssignmentUpdate(version, False, items)


def _config(data: Path) -> BrokerConfig:
    # flush=always: an acknowledged produce waits for an fsync round, which needs the flusher's
    # io_lock: the creation must hold neither the loop nor that lock. The coordinator address is
    # unreachable: replica fetchers are planned (and retry in the background), nothing is fetched.
    return BrokerConfig(data_dir=data, flush="always", broker_id=ME, coordinator="127.0.0.1:1")


async def _service(data: Path, first: AssignmentUpdate | None = None) -> BrokerService:
    config = _config(data)
    logs = LogManager(data, config.log_defaults())
    logs.open_all()
    service = BrokerService(config, logs)
    await service.start()
    if first is not None:
        await service.update_partitions(first)
    return service


async def _creation_started(service: BrokerService, creating: asyncio.Task[None], topic: str) -> None:
    """Wait (bounded) until the worker thread has created the first of ``topic``'s logs."""
    for _ in range(10_000):
        if service.logs.get(topic, 0) is not None:
            break
        await asyncio.sleep(0.001)
    assert service.logs.get(topic, 0) is not None, "the creation did not start"
    assert not creating.done()


def test_a_produce_is_answered_while_a_thousand_partitions_are_created(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _service(tmp_path, _assign("t", 1))
        try:
            creating = asyncio.create_task(service.update_partitions(_assign("big", CREATED)))
            await _creation_started(service, creating, "big")
            (result,) = await service.produce(1, 0, [ProduceItem("t", 0, batch(values(3)))])
            # Answered (and fsynced) while the creation is still running.
            assert result.error is None
            assert result.base_offset == 0
            assert not creating.done(), "the produce waited for the creation to finish"
            # None of the new partitions is served before all of its update's logs exist.
            assert ("big", 0) not in service.registry.served
            await creating
            assert all(("big", p) in service.registry.served for p in range(CREATED))
            (after,) = await service.produce(1, 0, [ProduceItem("big", CREATED - 1, batch(values(2)))])
            assert after.error is None
            assert after.base_offset == 0
        finally:
            await service.stop()

    asyncio.run(scenario())


def test_updates_apply_in_order_and_a_restart_serves_what_was_created(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _service(tmp_path, _assign("t", 1))
        try:
            # A removal sent while a large creation runs applies after it, not against half of it.
            full = AssignmentUpdate(
                1,
                True,
                (PartitionAssignment("t", "t-id", 0), *_assign("big", 200).assign),
            )
            first = asyncio.create_task(service.update_partitions(full))
            second = asyncio.create_task(
                service.update_partitions(
                    AssignmentUpdate(2, False, (), (PartitionAssignment("big", "big-id", 0),))
                )
            )
            await asyncio.gather(first, second)
            assert ("big", 0) not in service.registry.served
            assert service.logs.get("big", 0) is None
            assert all(("big", p) in service.registry.served for p in range(1, 200))
            assert service.metadata_version == 2
        finally:
            await service.stop()
        restarted = await _service(tmp_path)
        try:
            assert {k for k in restarted.registry.served if k[0] == "big"} == {
                ("big", p) for p in range(1, 200)
            }
        finally:
            await restarted.stop()

    asyncio.run(scenario())


def test_roles_epochs_and_leader_states_change_once_the_logs_exist(tmp_path: Path) -> None:
    """Replicated partitions: what the update unserves stops at once, its deleted logs leave the replica
    fetchers before any log is created, and the new roles, epochs (journaled first) and leader states
    arrive together once every log exists."""
    first = AssignmentUpdate(
        1,
        True,
        (
            PartitionAssignment("t", "t-id", 0),
            PartitionAssignment("f", "f-id", 0, leader=OTHER, leader_epoch=2, replicas=(OTHER, ME)),
            PartitionAssignment(
                "led", "led-id", 0, leader=ME, leader_epoch=1, replicas=(ME, OTHER), isr=(ME, OTHER)
            ),
        ),
        controller_epoch=3,
    )
    replicated: dict[str, Any] = {
        "leader": ME,
        "leader_epoch": 1,
        "partition_epoch": 1,
        "replicas": (ME, OTHER),
        "isr": (ME,),
    }
    second = AssignmentUpdate(
        2,
        False,
        (
            *_assign("big", SEVERAL_CHUNKS, **replicated).assign,
            # This broker's partition moves to the other broker: it becomes a follower.
            PartitionAssignment("led", "led-id", 0, leader=OTHER, leader_epoch=2, replicas=(ME, OTHER)),
        ),
        (PartitionAssignment("f", "f-id", 0),),
        controller_epoch=4,
    )

    async def scenario() -> None:
        service = await _service(tmp_path, first)
        try:
            assert ("f", 0) in service.fetchers.fetchers[OTHER].partitions
            assert ("led", 0) in service.leaders.states
            creating = asyncio.create_task(service.update_partitions(second))
            await _creation_started(service, creating, "big")
            (result,) = await service.produce(1, 0, [ProduceItem("t", 0, batch(values(3)))])
            assert result.error is None
            assert not creating.done(), "the produce waited for the creation to finish"
            # Done before the file work: the removed follower's log is deleted and no fetcher writes
            # into it; the partition moving away is no longer served, nor led.
            assert service.logs.get("f", 0) is None
            assert OTHER not in service.fetchers.fetchers
            assert ("led", 0) not in service.registry.served
            assert ("led", 0) not in service.leaders.states
            # Not yet: the new roles, the epochs (taken into the book once journaled) and leader states.
            marks = service.registry.epochs.marks
            assert ("led", 0) not in service.registry.following
            assert marks[("led", 0)].leader_epoch == 1
            assert service.registry.epochs.controller_epoch == 3
            assert ("big", 0) not in service.registry.served
            assert ("big", 0) not in marks
            assert ("big", 0) not in service.leaders.states
            await creating
            marks = service.registry.epochs.marks
            assert service.registry.epochs.controller_epoch == 4
            assert marks[("led", 0)].leader_epoch == 2
            assert service.registry.following[("led", 0)].leader == OTHER
            assert set(service.fetchers.fetchers[OTHER].partitions) == {("led", 0)}
            assert marks[("big", SEVERAL_CHUNKS - 1)] == EpochMark("big-id", 1, 1, True)
            assert all(("big", p) in service.leaders.states for p in range(SEVERAL_CHUNKS))
            assert service.metadata_version == 2
        finally:
            await service.stop()
        # The epochs were journaled with the update: a restart holds them, and holds the replicated
        # partitions until the controller speaks.
        restarted = await _service(tmp_path)
        try:
            assert restarted.registry.epochs.controller_epoch == 4
            assert restarted.registry.epochs.marks[("big", 7)] == EpochMark("big-id", 1, 1, True)
            assert ("big", 7) in restarted.registry.held
        finally:
            await restarted.stop()

    asyncio.run(scenario())


def test_an_update_whose_caller_goes_away_is_applied_whole(tmp_path: Path) -> None:
    """An RPC past its deadline cancels its handler; the update it carried is not cut between its steps
    (it would otherwise take its version with logs missing): it finishes and is journaled."""

    async def scenario() -> None:
        service = await _service(tmp_path, _assign("t", 1))
        try:
            creating = asyncio.create_task(service.update_partitions(_assign("big", SEVERAL_CHUNKS)))
            await _creation_started(service, creating, "big")
            creating.cancel()
            # Updates apply in arrival order: once a later one is answered, the first has finished.
            await service.update_partitions(_assign("t", 1))
            assert creating.cancelled()
            assert all(("big", p) in service.registry.served for p in range(SEVERAL_CHUNKS))
        finally:
            await service.stop()
        restarted = await _service(tmp_path)
        try:
            assert all(("big", p) in restarted.registry.served for p in range(SEVERAL_CHUNKS))
        finally:
            await restarted.stop()

    asyncio.run(scenario())
