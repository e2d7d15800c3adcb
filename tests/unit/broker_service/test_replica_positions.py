"""A follower's positions recorded as its fetch frame is read (docs/replication.md, "Fifth pass").

The wire server calls ``replica_positions`` from its read callback, before the fetch is queued and served
from a task: the HW advance, and the acks=all answer it completes, happen there. The fetch served later
must not record its (older) positions again, and a fetch that would be refused must record nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from sluice.broker.fetch import PartitionSpec
from sluice.broker.requests import FetchParams, ProduceItem

from .helpers import batch, values
from .test_replication_core import F1, F2, WIRE_CTX, _hw, _leader, _produce


def _params(replica: int, offset: int, epoch: int = 3, **kw: int) -> FetchParams:
    spec = PartitionSpec("t", 0, offset, 0, current_leader_epoch=epoch, replica_flushed_offset=offset)
    return FetchParams(kw.get("max_wait_ms", 0), 1, kw.get("max_bytes", 0), [spec], replica_id=replica)


def test_positions_count_when_read_and_complete_acks_all_before_the_fetch_is_served(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _leader(tmp_path)
        _produce(service, 3)
        results, _ = service.append(-1, 5000, [ProduceItem("t", 0, batch(values(2)))])
        commit = results[0].commit_offset
        waiting = asyncio.ensure_future(service.wait_durable(results, 5000))
        early = service.replica_positions(_params(F1, 5), WIRE_CTX)
        assert early.positions_recorded
        assert _hw(service) == 0  # F2 holds it back
        service.replica_positions(_params(F2, 5), WIRE_CTX)
        # Committed by the two reads alone: neither fetch has been served.
        assert _hw(service) == 5 > commit
        await asyncio.wait_for(waiting, 1)
        assert results[0].error is None
        # Served later, the fetch does not record its positions again: a stale offset (here 0, as a
        # request queued behind an older one could carry) leaves the recorded 5 in place.
        stale = FetchParams(0, 1, 0, [PartitionSpec("t", 0, 0, 0, current_leader_epoch=3)], replica_id=F1)
        marked = dataclasses.replace(stale, positions_recorded=True)
        await service.fetch(marked, WIRE_CTX)
        assert service.leaders.states[("t", 0)].followers[F1].leo == 5
        # Unmarked, it records as it always did.
        await service.fetch(stale, WIRE_CTX)
        assert service.leaders.states[("t", 0)].followers[F1].leo == 0
        await service.stop()

    asyncio.run(scenario())


def test_a_fetch_that_would_be_refused_records_nothing_when_read(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _leader(tmp_path)
        _produce(service, 4)
        # Limits above the broker's caps: refused when served, so not recorded when read.
        bad = _params(F1, 4, max_bytes=service.caps.max_bytes + 1)
        assert not service.replica_positions(bad, WIRE_CTX).positions_recorded
        # A consumer's fetch is not a follower's.
        consumer = FetchParams(0, 1, 0, [PartitionSpec("t", 0, 0, 0)])
        assert not service.replica_positions(consumer, WIRE_CTX).positions_recorded
        # An old leader epoch (fenced): marked, but nothing recorded for the partition.
        fenced = service.replica_positions(_params(F1, 4, epoch=2), WIRE_CTX)
        assert service.leaders.states[("t", 0)].followers[F1].leo == -1
        assert fenced.positions_recorded
        await service.stop()
        assert not service.replica_positions(_params(F2, 4), WIRE_CTX).positions_recorded  # stopping

    asyncio.run(scenario())
