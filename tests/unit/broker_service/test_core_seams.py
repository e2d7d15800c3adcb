"""The broker core in-process over real logs: the one parked-read mechanism and the seams.

- long-poll and follow park through the same ``ParkedRead``: a follow keeps one watch across
  its rounds, a long-poll's answer holds what was appended before its task ran again, and both
  give the watch back;
- the authorization seam: one authorizer, asked by the core, refuses the same partition in a
  produce, a fetch, a follow round and a ListOffsets;
- the replication seam: a fetch with a replica id is refused unless the fetcher is a replica.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment
from sluice.broker.config import BrokerConfig
from sluice.broker.fetch import PartitionSpec
from sluice.broker.log.manager import LogManager
from sluice.broker.requests import FetchOutcome, FetchParams, OffsetQuery, ProduceItem
from sluice.broker.service import BrokerService
from sluice.errors import AuthorizationError, InvalidRequest
from sluice.security.context import WIRE, Operation, Principal, RequestContext, Resource

from .helpers import batch, values

WIRE_CTX = RequestContext(Principal("alice"), WIRE)


class RefuseTopic:
    """An authorizer that refuses one topic to everyone, recording what it was asked."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.asked: list[tuple[str, Operation, str]] = []

    def allowed(self, ctx: RequestContext, operation: Operation, resource: Resource) -> bool:
        return resource.name != self.topic

    def authorize(self, ctx: RequestContext, operation: Operation, resource: Resource) -> None:
        self.asked.append((ctx.principal.name, operation, resource.name))
        if resource.name == self.topic:
            raise AuthorizationError(f"{ctx.principal.name} may not {operation.value} {resource.name}")


async def _service(data: Path, authorizer: RefuseTopic | None = None) -> BrokerService:
    config = BrokerConfig(data_dir=data, flush="never")
    logs = LogManager(data, config.log_defaults())
    logs.open_all()
    service = BrokerService(config, logs, authorizer=authorizer)
    await service.start()
    assigned = tuple(PartitionAssignment(t, f"id-{t}", 0) for t in ("t", "secret"))
    await service.update_partitions(AssignmentUpdate(0, False, assigned))
    return service


def _parked(service: BrokerService) -> float:
    parked: float = service.metrics.fetch_parked._value.get()  # prometheus_client's internals are untyped
    return parked


def test_a_follow_keeps_one_watch_across_rounds_and_gives_it_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _service(tmp_path)
        first = await service.fetch(
            FetchParams(1000, 1, 0, [PartitionSpec("t", 0, 0, 0)], continuous=True), WIRE_CTX
        )
        assert first.follow is not None
        answers: list[FetchOutcome] = []
        follow = service.follow(first.follow, WIRE_CTX, lambda o, _started: answers.append(o), lambda: True)
        await asyncio.sleep(0)
        watchers = set()
        for i in range(5):
            service.append(1, 0, [ProduceItem("t", 0, batch(values(1, f"r{i}-")))], WIRE_CTX)
            # Answered inside the append, before the producer's call returned.
            assert len(answers) == i + 1
            assert answers[-1].partitions[0].position == i + 1
            await asyncio.sleep(0)  # the next round parks again
            assert len(service.waiters) == 1
            watchers.add(id(next(iter(service.waiters._all))))
            assert _parked(service) == 1
        assert len(watchers) == 1, "one ParkedRead serves every round"
        follow.stop()
        assert len(service.waiters) == 0
        assert _parked(service) == 0
        await service.stop()

    asyncio.run(scenario())


def test_a_long_poll_holds_what_was_appended_before_its_task_ran(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _service(tmp_path)
        parked = asyncio.create_task(service.fetch(FetchParams(5000, 1, 0, [PartitionSpec("t", 0, 0, 0)])))
        await asyncio.sleep(0.01)
        assert _parked(service) == 1
        for i in range(3):  # no yield between: the first makes it ready, the others still count
            service.append(1, 0, [ProduceItem("t", 0, batch(values(2, f"b{i}-")))])
        outcome = await parked
        assert outcome.partitions[0].position == 6
        assert len(outcome.partitions[0].batches) == 3
        assert len(service.waiters) == 0
        assert _parked(service) == 0
        await service.stop()

    asyncio.run(scenario())


def test_one_authorizer_refuses_the_same_topic_in_every_operation(tmp_path: Path) -> None:
    async def scenario() -> None:
        authorizer = RefuseTopic("secret")
        service = await _service(tmp_path, authorizer)
        records = batch(values(1))
        produced = await service.produce(
            1, 0, [ProduceItem("t", 0, records), ProduceItem("secret", 0, records)], WIRE_CTX
        )
        assert produced[0].error is None
        assert isinstance(produced[1].error, AuthorizationError)
        assert produced[1].error.message == "alice may not write secret"
        fetched = await service.fetch(
            FetchParams(0, 1, 0, [PartitionSpec("t", 0, 0, 0), PartitionSpec("secret", 0, 0, 0)]), WIRE_CTX
        )
        assert fetched.partitions[0].error is None
        assert fetched.partitions[0].batches
        assert isinstance(fetched.partitions[1].error, AuthorizationError)
        offsets = service.list_offsets([OffsetQuery("secret", 0, -1)], WIRE_CTX)
        assert isinstance(offsets[0].error, AuthorizationError)
        assert ("alice", Operation.DESCRIBE, "secret") in authorizer.asked
        assert ("alice", Operation.READ, "t") in authorizer.asked
        assert ("", Operation.CLUSTER_ACTION, "") in authorizer.asked  # the update in _service
        # A follow's rounds ask too: a refusal ends it with the partition's error.
        first = await service.fetch(
            FetchParams(1000, 1, 0, [PartitionSpec("t", 0, 1, 0)], continuous=True), WIRE_CTX
        )
        assert first.follow is not None
        authorizer.topic = "t"  # access revoked while following
        answers: list[FetchOutcome] = []
        service.follow(first.follow, WIRE_CTX, lambda o, _started: answers.append(o), lambda: True)
        assert isinstance(answers[0].partitions[0].error, AuthorizationError)
        assert len(service.waiters) == 0
        await service.stop()

    asyncio.run(scenario())


def test_a_replica_fetch_is_refused_unless_the_fetcher_is_a_replica(tmp_path: Path) -> None:
    async def scenario() -> None:
        service = await _service(tmp_path)
        # The partition is served here with one replica: broker 2 is no follower of it.
        outcome = await service.fetch(FetchParams(0, 1, 0, [PartitionSpec("t", 0, 0, 0)], replica_id=2))
        error = outcome.partitions[0].error
        assert isinstance(error, InvalidRequest)
        assert "not a follower" in error.message
        await service.stop()

    asyncio.run(scenario())
