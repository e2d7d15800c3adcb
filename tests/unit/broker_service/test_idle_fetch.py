"""An idle long-poll costs the broker per partition that changed, not per partition fetched.

In process, over real logs: 1,000 partitions fetched through an incremental fetch session (the
gRPC path) and through a follow (the wire path). Work is counted, not timed: the partitions the
core routes into a read (``BrokerService.partitions_routed``) and the watch registrations it
makes (``AppendWaiters.key_changes``). Once a session or a follow has read its partitions, an
idle long-poll that expires must route and register none of them, and an append to one
partition must cost that one partition.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment
from sluice.broker.config import BrokerConfig
from sluice.broker.fetch import PartitionRead, PartitionSpec
from sluice.broker.handlers import FollowAnswers, RequestHandlers, fetch_response_to_proto
from sluice.broker.log.manager import LogManager
from sluice.broker.requests import FetchOutcome, FetchParams, ProduceItem
from sluice.broker.service import BrokerService
from sluice.security.context import ANONYMOUS, WIRE, RequestContext
from sluice.v1 import broker_pb2

from .helpers import batch, values

PARTITIONS = 1000
MAX_WAIT_MS = 20
WIRE_CTX = RequestContext(ANONYMOUS, WIRE)


@pytest.fixture(autouse=True)
def _descriptors() -> Iterator[None]:
    """A partition log holds a few descriptors: 1,000 of them need more than a 1,024 soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def _service(data: Path, partitions: int = PARTITIONS) -> BrokerService:
    config = BrokerConfig(data_dir=data, flush="never")
    logs = LogManager(data, config.log_defaults())
    logs.open_all()
    service = BrokerService(config, logs)
    await service.start()
    assigned = tuple(PartitionAssignment("t", "id-t", p) for p in range(partitions))
    await service.update_partitions(AssignmentUpdate(0, False, assigned))
    return service


def _work(service: BrokerService) -> tuple[int, int]:
    return service.partitions_routed, service.waiters.key_changes


def _append(service: BrokerService, partition: int, tag: str) -> None:
    results, _durable = service.append(1, 0, [ProduceItem("t", partition, batch(values(1, tag)))])
    assert results[0].error is None


def test_an_idle_session_long_poll_touches_no_partition(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _service(tmp_path)
        specs = [PartitionSpec("t", p, 0, 0) for p in range(PARTITIONS)]
        opened = await service.fetch(FetchParams(MAX_WAIT_MS, 1, 0, specs, session_id=0, session_epoch=0))
        assert opened.error is None
        assert len(opened.partitions) == PARTITIONS
        session, epoch = opened.session_id, 1

        async def incremental(*changed: PartitionSpec) -> FetchOutcome:
            nonlocal epoch
            outcome = await service.fetch(
                FetchParams(MAX_WAIT_MS, 1, 0, list(changed), session_id=session, session_epoch=epoch)
            )
            assert outcome.error is None
            epoch += 1
            return outcome

        await incremental()  # the first incremental fetch still reads what the open answered
        before = _work(service)
        for _ in range(5):
            assert (await incremental()).partitions == []  # max_wait passed: an empty answer
        assert _work(service) == before, "an idle long-poll routed or watched partitions"

        # An append wakes the parked fetch; it reads that partition alone.
        parked = asyncio.create_task(incremental())
        await asyncio.sleep(MAX_WAIT_MS / 4000)
        _append(service, 7, "a")
        woken = await parked
        assert [(p.key, p.position) for p in woken.partitions] == [(("t", 7), 1)]
        # The client sends that partition's new offset; the fetch reads it and nothing else.
        routed = service.partitions_routed
        assert (await incremental(PartitionSpec("t", 7, 1, 0))).partitions == []
        assert service.partitions_routed == routed + 1
        assert _work(service)[1] == before[1], "the session's watch was registered again"
        await service.stop()

    asyncio.run(scenario())


def test_an_idle_follow_round_touches_no_partition_yet_answers_them_all(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _service(tmp_path)
        handlers = RequestHandlers(service)
        request = broker_pb2.FetchRequest(
            max_wait_ms=MAX_WAIT_MS,
            min_bytes=1,
            session_epoch=-1,
            continuous=True,
            request_id=5,
            partitions=[broker_pb2.FetchPartition(topic="t", partition=p) for p in range(PARTITIONS)],
        )
        first, plan = await handlers.fetch(request, WIRE_CTX)
        assert plan is not None
        assert len(first.partitions) == PARTITIONS
        sent: list[bytes] = []

        def send(answer: bytes, _has_records: bool) -> None:
            sent.append(answer)

        follow = handlers.follow(plan, 5, WIRE_CTX, send, lambda: True)

        async def rounds(count: int, start: int | None = None) -> list[broker_pb2.FetchResponse]:
            """The ``count`` answers from ``start`` (default: the next; a round is at most a
            max_wait away)."""
            start = len(sent) if start is None else start
            for _ in range(count * 50):
                if len(sent) >= start + count:
                    break
                await asyncio.sleep(MAX_WAIT_MS / 1000)
            assert len(sent) >= start + count, "the follow stopped answering"
            return [broker_pb2.FetchResponse.FromString(b) for b in sent[start : start + count]]

        await rounds(1)  # the first round reads every partition once
        before = _work(service)
        for answer in await rounds(5):
            # The wire answer still names every partition, at its offset, with no records.
            assert answer.request_id == 5
            assert len(answer.partitions) == PARTITIONS
            assert not any(p.records or p.next_offset or p.error.code for p in answer.partitions)
        assert _work(service) == before, "an idle follow round routed or watched partitions"

        answered = len(sent)
        _append(service, 3, "b")  # answered inside the append
        (answer,) = await rounds(1, answered)
        with_records = [p.partition for p in answer.partitions if p.records]
        assert with_records == [3]
        assert len(answer.partitions) == PARTITIONS
        assert next(p for p in answer.partitions if p.partition == 3).next_offset == 1
        assert service.partitions_routed == before[0] + 1
        (answer,) = await rounds(1)  # and then idle again: partition 3 without its records now
        assert not any(p.records for p in answer.partitions)
        assert next(p for p in answer.partitions if p.partition == 3).next_offset == 1
        assert service.partitions_routed == before[0] + 1
        follow.stop()
        assert len(service.waiters) == 0
        await service.stop()

    asyncio.run(scenario())


def test_a_fetch_parked_on_a_session_that_is_replaced_answers_at_once(tmp_path: Path) -> None:
    """Nothing wakes a read parked on a dropped session's watch any more (not even shutdown), so
    dropping the session answers it."""

    async def scenario() -> None:
        service = await _service(tmp_path, partitions=2)
        spec = PartitionSpec("t", 0, 0, 0)
        opened = await service.fetch(FetchParams(0, 1, 0, [spec], session_id=0, session_epoch=0))
        session = opened.session_id
        parked = asyncio.create_task(
            service.fetch(FetchParams(10_000, 1, 0, [], session_id=session, session_epoch=1))
        )
        await asyncio.sleep(0.05)
        assert not parked.done()
        # The client opens a new session in place of that one.
        await service.fetch(FetchParams(0, 1, 0, [spec], session_id=session, session_epoch=0))
        outcome = await asyncio.wait_for(parked, 5)
        assert outcome.partitions == []
        assert len(service.waiters) == 1, "only the new session's watch is left"
        await service.stop()

    asyncio.run(scenario())


def test_a_follow_answer_from_cached_entries_equals_the_whole_answer_encoded() -> None:
    parts = []
    for partition in range(3):
        part = PartitionRead(spec=PartitionSpec("t", partition, 5, 0), log=None, position=5)
        part.high_watermark, part.log_start_offset = 9, 2
        parts.append(part)
    answers = FollowAnswers(7)

    def sent(outcome: FetchOutcome) -> broker_pb2.FetchResponse:
        return broker_pb2.FetchResponse.FromString(answers.encode(outcome))

    def whole() -> broker_pb2.FetchResponse:
        return fetch_response_to_proto(FetchOutcome(0, parts), 7)

    assert sent(FetchOutcome(0, parts)) == whole()
    parts[1].batches += [b"a" * 200, b"b" * 300]
    parts[1].position = 9
    assert sent(FetchOutcome(0, [parts[1]], delta=True)) == whole()
    parts[1].batches.clear()  # the next round has no news: partition 1 as last told, no records
    assert sent(FetchOutcome(0, [], delta=True)) == whole()
