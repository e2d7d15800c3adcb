"""The leader's half of replication in-process, over real logs (docs/replication.md, "The data path").

- the HW is the smallest LEO over the ISR; under flush=always at most the min-ISR-th highest flushed
  offset; it does not move while the ISR is below min ISR (strict, KIP-966), and never goes down;
- consumers read up to the HW, and a parked consumer wakes when the HW moves, not on the append; a
  follower's continuous (wire) replica fetch reads to the log end and wakes on the append;
- acks=all waits for the HW, is refused below min ISR, and times out with REQUEST_TIMED_OUT;
- leader epochs: a fetch naming an older one is FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH;
- OffsetForLeaderEpoch answers from the leader's epoch cache.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment
from sluice.broker.config import BrokerConfig
from sluice.broker.fetch import PartitionSpec
from sluice.broker.log.manager import LogManager
from sluice.broker.requests import EpochQuery, FetchOutcome, FetchParams, OffsetQuery, ProduceItem
from sluice.broker.service import BrokerService
from sluice.errors import (
    BrokerNotAvailable,
    FencedLeaderEpoch,
    NotEnoughReplicas,
    NotLeader,
    RequestTimedOut,
    UnknownLeaderEpoch,
)
from sluice.security.context import WIRE, Principal, RequestContext

from .helpers import batch, values

WIRE_CTX = RequestContext(Principal("follower"), WIRE)
ME, F1, F2 = 0, 1, 2


async def _leader(data: Path, isr: tuple[int, ...] = (ME, F1, F2), flush: str = "never") -> BrokerService:
    config = BrokerConfig(data_dir=data, flush=flush, broker_id=ME)
    logs = LogManager(data, config.log_defaults())
    logs.open_all()
    service = BrokerService(config, logs)
    await service.start()
    await _assign(service, isr, version=1)
    return service


async def _assign(service: BrokerService, isr: tuple[int, ...], version: int, epoch: int = 3) -> None:
    item = PartitionAssignment(
        "t", "tid", 0, leader=ME, leader_epoch=epoch, partition_epoch=version,
        replicas=(ME, F1, F2), isr=isr, min_insync_replicas=2,
    )  # fmt: skip
    await service.update_partitions(AssignmentUpdate(version, True, (item,)))


def _produce(service: BrokerService, n: int, acks: int = 1) -> int:
    results, _ = service.append(acks, 1000, [ProduceItem("t", 0, batch(values(n)))])
    assert results[0].error is None, results[0].error
    return results[0].base_offset


async def _replica_fetch(service: BrokerService, replica: int, offset: int, epoch: int = 3) -> FetchOutcome:
    spec = PartitionSpec("t", 0, offset, 0, current_leader_epoch=epoch, replica_flushed_offset=offset)
    return await service.fetch(FetchParams(0, 1, 0, [spec], replica_id=replica))


def _hw(service: BrokerService) -> int:
    return service.leaders.states[("t", 0)].hw


def test_the_hw_is_the_smallest_isr_leo_and_consumers_read_up_to_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _leader(tmp_path)
        _produce(service, 4)
        _produce(service, 2)
        assert _hw(service) == 0
        consumer = await service.fetch(FetchParams(0, 1, 0, [PartitionSpec("t", 0, 0, 0)]))
        assert consumer.partitions[0].records == b""
        assert consumer.partitions[0].high_watermark == 0
        # A follower reads to the log end.
        read = await _replica_fetch(service, F1, 0)
        assert read.partitions[0].position == 6
        await _replica_fetch(service, F1, 6)  # F1 holds all 6
        assert _hw(service) == 0  # F2 has not fetched yet
        await _replica_fetch(service, F2, 4)  # F2 holds the first batch
        assert _hw(service) == 4
        consumer = await service.fetch(FetchParams(0, 1, 0, [PartitionSpec("t", 0, 0, 0)]))
        assert consumer.partitions[0].position == 4  # the second batch is above the HW
        assert consumer.partitions[0].high_watermark == 4
        latest = service.list_offsets([OffsetQuery("t", 0, -1)])[0]
        assert latest.offset == 4
        # An offset between the HW and the log end is in range, with nothing to read yet.
        above = await service.fetch(FetchParams(0, 1, 0, [PartitionSpec("t", 0, 5, 0)]))
        assert above.partitions[0].error is None
        assert above.partitions[0].records == b""
        # The HW never goes down (a follower reporting a lower position after a retry).
        await _replica_fetch(service, F2, 2)
        assert _hw(service) == 4
        await service.stop()

    asyncio.run(scenario())


def test_strict_min_isr_stops_the_hw_and_refuses_acks_all(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _leader(tmp_path, isr=(ME,))
        _produce(service, 3)
        assert _hw(service) == 0  # the leader alone is below min ISR 2: nothing commits
        results, _ = service.append(-1, 1000, [ProduceItem("t", 0, batch(values(1)))])
        assert isinstance(results[0].error, NotEnoughReplicas)
        await _assign(service, (ME, F1), version=2)
        await _replica_fetch(service, F1, 3)
        assert _hw(service) == 3
        await service.stop()

    asyncio.run(scenario())


def test_acks_all_is_answered_when_the_hw_passes_the_batch_or_times_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _leader(tmp_path, isr=(ME, F1))
        answered = asyncio.ensure_future(service.produce(-1, 5000, [ProduceItem("t", 0, batch(values(2)))]))
        await asyncio.sleep(0.05)
        assert not answered.done()
        await _replica_fetch(service, F1, 1)  # not past the batch's last offset (1)
        await asyncio.sleep(0.01)
        assert not answered.done()
        await _replica_fetch(service, F1, 2)
        results = await asyncio.wait_for(answered, 1)
        assert results[0].error is None
        assert results[0].base_offset == 0
        timed_out = await service.produce(-1, 100, [ProduceItem("t", 0, batch(values(1)))])
        assert isinstance(timed_out[0].error, RequestTimedOut)
        # Stopping answers a waiting acks=all at once (followers' fetches are refused from then on).
        waiting = asyncio.ensure_future(service.produce(-1, 60_000, [ProduceItem("t", 0, batch(values(1)))]))
        await asyncio.sleep(0.01)
        started = asyncio.get_running_loop().time()
        await service.stop()
        assert asyncio.get_running_loop().time() - started < 5
        assert isinstance((await waiting)[0].error, BrokerNotAvailable)

    asyncio.run(scenario())


def test_a_parked_consumer_wakes_on_the_hw_and_a_replica_follow_on_the_append(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _leader(tmp_path, isr=(ME, F1))
        _produce(service, 2)
        consumer = asyncio.ensure_future(
            service.fetch(FetchParams(5000, 1, 0, [PartitionSpec("t", 0, 0, 0)]))
        )
        spec = PartitionSpec("t", 0, 0, 0, current_leader_epoch=3)
        first = await service.fetch(FetchParams(5000, 1, 0, [spec], continuous=True, replica_id=F1), WIRE_CTX)
        assert first.partitions[0].position == 2  # a follower reads to the log end
        assert first.follow is not None
        rounds: list[FetchOutcome] = []
        following = service.follow(first.follow, WIRE_CTX, lambda o, _s: rounds.append(o), lambda: True)
        await asyncio.sleep(0.01)
        assert not rounds  # parked: nothing new
        _produce(service, 2)
        assert rounds  # the replica's follow got the batch on the append, inside it...
        assert rounds[-1].partitions[0].position == 4
        await asyncio.sleep(0.01)
        assert not consumer.done()  # ...the consumer did not: the HW has not moved
        await _replica_fetch(service, F1, 4)
        answer = await asyncio.wait_for(consumer, 1)
        assert answer.partitions[0].position == 4
        following.stop()
        await service.stop()

    asyncio.run(scenario())


def test_leader_epochs_are_checked_and_offset_for_leader_epoch_answers_from_the_cache(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _leader(tmp_path)
        _produce(service, 3)  # stamped with leader epoch 3
        old = await _replica_fetch(service, F1, 0, epoch=2)
        assert isinstance(old.partitions[0].error, FencedLeaderEpoch)
        new = await _replica_fetch(service, F1, 0, epoch=4)
        assert isinstance(new.partitions[0].error, UnknownLeaderEpoch)
        consumer = await service.fetch(
            FetchParams(0, 1, 0, [PartitionSpec("t", 0, 0, 0, current_leader_epoch=2)])
        )
        assert isinstance(consumer.partitions[0].error, FencedLeaderEpoch)
        answer = service.offset_for_leader_epoch([EpochQuery("t", 0, 3)])[0]
        assert (answer.leader_epoch, answer.end_offset) == (3, 3)
        # A new leader epoch is recorded at the log end before anything is appended in it (KIP-279):
        # epoch 3 now ends where epoch 4 starts.
        await _assign(service, (ME, F1, F2), version=2, epoch=4)
        answer = service.offset_for_leader_epoch([EpochQuery("t", 0, 3)])[0]
        assert (answer.leader_epoch, answer.end_offset) == (3, 3)
        answer = service.offset_for_leader_epoch([EpochQuery("t", 0, 4)])[0]
        assert (answer.leader_epoch, answer.end_offset) == (4, 3)
        plog = service.logs.get("t", 0)
        assert plog is not None
        assert plog.epoch_entries()[-1] == (4, 3)
        await service.stop()

    asyncio.run(scenario())


def test_the_hw_under_flush_always_waits_for_min_isr_fsyncs(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _leader(tmp_path, flush="always")
        results = await service.produce(1, 1000, [ProduceItem("t", 0, batch(values(4)))])  # fsync'ed here
        assert results[0].error is None
        state = service.leaders.states[("t", 0)]
        # Both followers hold the batch but report nothing fsync'ed: only the leader's copy is on disk.
        state.record_fetch(F1, 4, 0, 0)
        state.record_fetch(F2, 4, 0, 0)
        assert state.hw == 0
        state.record_fetch(F1, 4, 4, 0)  # a second copy on disk: min ISR 2 replicas fsync'ed it
        assert state.hw == 4
        await service.stop()

    asyncio.run(scenario())


def test_a_restarted_leader_waits_for_the_controller_then_reads_up_to_its_checkpointed_hw(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        service = await _leader(tmp_path, isr=(ME, F1))
        _produce(service, 4)
        await _replica_fetch(service, F1, 4)
        _produce(service, 2)  # not replicated: above the HW
        assert _hw(service) == 4
        await service.stop()  # writes the HW checkpoint

        config = BrokerConfig(data_dir=tmp_path, flush="never", broker_id=ME)
        logs = LogManager(tmp_path, config.log_defaults())
        logs.open_all()
        restarted = BrokerService(config, logs)
        await restarted.start()
        # A replicated partition is held until the controller confirms who leads (another replica may
        # have been elected meanwhile): neither reads nor writes (docs/replication.md, "Roles").
        held = await restarted.fetch(FetchParams(0, 1, 0, [PartitionSpec("t", 0, 0, 0)]))
        assert isinstance(held.partitions[0].error, NotLeader)
        refused, _ = restarted.append(-1, 1000, [ProduceItem("t", 0, batch(values(1)))])
        assert isinstance(refused[0].error, NotLeader)
        await _assign(restarted, (ME, F1), version=2)
        # Led again: the HW starts from the checkpoint, so the uncommitted tail stays hidden.
        read = await restarted.fetch(FetchParams(0, 1, 0, [PartitionSpec("t", 0, 0, 0)]))
        assert read.partitions[0].position == 4  # not 6
        assert read.partitions[0].high_watermark == 4
        await _replica_fetch(restarted, F1, 6)
        assert _hw(restarted) == 6
        await restarted.stop()

    asyncio.run(scenario())


def test_an_isr_follower_fetching_below_the_hw_lost_records_and_leaves_at_once(tmp_path: Path) -> None:
    """An ISR member holds everything committed; one that asks for less (restarted after a power loss,
    or cut back to a damaged batch) must not stay eligible for election (docs/replication.md, "Power loss
    and corruption")."""

    async def scenario() -> None:
        service = await _leader(tmp_path)
        _produce(service, 6)
        await _replica_fetch(service, F1, 6)
        await _replica_fetch(service, F2, 6)
        assert _hw(service) == 6
        state = service.leaders.states[("t", 0)]
        now = service.leaders._clock_ms()
        assert state.lagging(now, 60_000) == []
        await _replica_fetch(service, F2, 4)  # F2 came back with less than it had
        assert state.lagging(now, 60_000) == [F2]  # out now, not after the lag bound
        assert _hw(service) == 6  # and the HW never goes down
        await service.stop()

    asyncio.run(scenario())
