"""BrokerNotifier against a real in-process gRPC Broker peer that follows the documented broker contract.

The peer applies an update only if its version is newer than what it has (and, while it has applied
nothing, only a full one). Whatever the coordinator pushes - deltas, fulls, after failures - the peer must
end up holding exactly the coordinator's assignment for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from coordinator_context import ClusterContext
from grpc import aio
from tests.broker_peer import CoordinatorFacingBroker

from sluice.coordinator.broker_updates import UNKNOWN_VERSION, BrokerNotifier, PushOutcome
from sluice.coordinator.cluster.model import Endpoint, MetadataChange
from sluice.coordinator.cluster.reassign import Reassignment, start_reassignments
from sluice.v1 import broker_pb2, broker_pb2_grpc


class ContractBroker(CoordinatorFacingBroker):
    def __init__(self) -> None:
        self.version = 0
        self.partitions: dict[tuple[str, int], str] = {}
        self.received: list[broker_pb2.UpdatePartitionsRequest] = []
        self.fail_next = 0
        self.removed: list[tuple[str, int, str]] = []
        #: While set and not released, an update waits here (a push in flight).
        self.hold: asyncio.Event | None = None

    async def UpdatePartitions(
        self, request: broker_pb2.UpdatePartitionsRequest, context: aio.ServicerContext[Any, Any]
    ) -> broker_pb2.UpdatePartitionsResponse:
        if self.fail_next:
            self.fail_next -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "injected failure")
        if self.hold is not None:
            await self.hold.wait()
        self.received.append(request)
        self.removed.extend((a.topic, a.partition, a.topic_id) for a in request.remove)
        if request.full:
            if request.metadata_version >= self.version:
                self.partitions = {(a.topic, a.partition): a.topic_id for a in request.assign}
                self.version = request.metadata_version
        elif self.version > 0 and request.metadata_version > self.version:
            for a in request.remove:
                if self.partitions.get((a.topic, a.partition)) == a.topic_id:
                    del self.partitions[(a.topic, a.partition)]
            for a in request.assign:
                self.partitions[(a.topic, a.partition)] = a.topic_id
            self.version = request.metadata_version
        return broker_pb2.UpdatePartitionsResponse()


def expected(ctx: ClusterContext, broker_id: int) -> dict[tuple[str, int], str]:
    return {(r.topic, r.partition): r.topic_id for r in ctx.state.broker_assignment(broker_id).assign}


@contextlib.asynccontextmanager
async def _pushing(
    timeout_s: float,
) -> AsyncIterator[tuple[ContractBroker, int, ClusterContext, BrokerNotifier]]:
    """A contract-following peer on a real gRPC server, a cluster state and a notifier pushing to it."""
    peer = ContractBroker()
    server = aio.server()
    broker_pb2_grpc.add_BrokerServicer_to_server(peer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ctx = ClusterContext()
    notifier = BrokerNotifier(ctx.state.broker_assignment, timeout_s=timeout_s)
    try:
        yield peer, port, ctx, notifier
    finally:
        await notifier.close()
        await server.stop(None)


async def _scenario() -> None:
    async with _pushing(2.0) as (peer, port, ctx, notifier):
        reg = ctx.register_broker(1, port=port)
        notifier.registered(1, Endpoint("127.0.0.1", port), known_version=0)
        assert reg.change is not None
        await asyncio.gather(*notifier.submit(reg.change, [1]).values())

        async def change(c: MetadataChange) -> list[bool]:
            # True: acknowledged (the outcome None); otherwise the outcome says why not.
            outcomes = await asyncio.gather(*notifier.submit(c, ctx.state.live_brokers(ctx.now_ms)).values())
            return [o is None for o in outcomes]

        # A fresh broker (version 0) first gets a full update; then contiguous deltas.
        assert await change(ctx.create_topic("a", 3).change) == [True]
        assert await change(ctx.create_topic("b", 2).change) == [True]
        # (The registration's change and topic "a" were still queued together: one full covers both.)
        assert [r.full for r in peer.received] == [True, False]
        assert (peer.version, peer.partitions) == (ctx.state.metadata_version, expected(ctx, 1))

        # A failed push: we no longer know the broker's version, so the next push is a full one.
        peer.fail_next = 1
        assert await change(ctx.delete_topic("a").change) == [False]
        assert peer.partitions != expected(ctx, 1)
        assert await change(ctx.create_topic("c", 1).change) == [True]
        assert peer.received[-1].full
        # The removal that failed travels with the next update, so the broker can delete the data.
        assert {(r.topic, r.partition) for r in peer.received[-1].remove} == {("a", p) for p in range(3)}
        assert (peer.version, peer.partitions) == (ctx.state.metadata_version, expected(ctx, 1))

        # Several changes queued at once are sent in version order and all acknowledged.
        futures: list[asyncio.Future[PushOutcome]] = []
        for name in ("d", "e", "f"):
            futures += notifier.submit(ctx.create_topic(name, 2).change, [1]).values()
        futures += notifier.submit(ctx.delete_topic("b").change, [1]).values()
        assert all(o is None for o in await asyncio.gather(*futures))
        assert (peer.version, peer.partitions) == (ctx.state.metadata_version, expected(ctx, 1))
        versions = [r.metadata_version for r in peer.received]
        assert versions == sorted(versions)
        assert not peer.received[-1].full
        assert {r.topic for r in peer.received[-1].remove} == {"b"}

        # A heartbeat report resets what we know; a report older than us means the next push is full.
        notifier.observed(1, 1)
        assert await change(ctx.create_topic("g", 1).change) == [True]
        assert peer.received[-1].full
        assert (peer.version, peer.partitions) == (ctx.state.metadata_version, expected(ctx, 1))

        # Deleted (push lost) and re-created: the new topic_id replaces the log; no removal may hit it.
        peer.fail_next = 1
        assert await change(ctx.delete_topic("g").change) == [False]
        assert await change(ctx.create_topic("g", 1).change) == [True]
        assert not any(r.topic == "g" for r in peer.received[-1].remove)
        assert peer.partitions[("g", 0)] == ctx.state.topics["g"].topic_id
        assert (peer.version, peer.partitions) == (ctx.state.metadata_version, expected(ctx, 1))

        # A broker not registered with the notifier: nothing to push to, reported as not acknowledged.
        ctx.register_broker(2, port=1)
        unknown = notifier.submit(MetadataChange(0, 1, assign={2: ()}), [2])
        assert [f.result() is None for f in unknown.values()] == [False]
        notifier.registered(2, Endpoint("127.0.0.1", 1), UNKNOWN_VERSION)


def test_pushes_keep_a_contract_following_broker_consistent() -> None:
    asyncio.run(_scenario())


async def _lost_removal_scenario() -> None:
    async with _pushing(2.0) as (peer, port, ctx, notifier):
        reg = ctx.register_broker(1, port=port)
        notifier.registered(1, Endpoint("127.0.0.1", port), known_version=0)
        assert reg.change is not None
        await asyncio.gather(*notifier.submit(reg.change, [1]).values())
        await asyncio.gather(*notifier.submit(ctx.create_topic("a", 2).change, [1]).values())
        # The removal's push is lost, and no other change for this broker follows (as after a drain).
        peer.fail_next = 1
        outcomes = await asyncio.gather(*notifier.submit(ctx.delete_topic("a").change, [1]).values())
        assert outcomes[0] is not None
        assert not peer.removed
        # Its next heartbeat sends the removals on their own.
        notifier.observed(1, peer.version)
        for _ in range(100):
            if peer.removed:
                break
            await asyncio.sleep(0.05)
        assert {(t, p) for t, p, _ in peer.removed} == {("a", 0), ("a", 1)}
        assert (peer.version, peer.partitions) == (ctx.state.metadata_version, expected(ctx, 1))


def test_a_lost_removal_is_sent_at_the_brokers_next_heartbeat_when_no_update_follows() -> None:
    asyncio.run(_lost_removal_scenario())


async def _heartbeat_overtakes_scenario() -> None:
    async with _pushing(5.0) as (peer, port, ctx, notifier):
        reg = ctx.register_broker(1, port=port)
        notifier.registered(1, Endpoint("127.0.0.1", port), known_version=0)
        assert reg.change is not None
        await asyncio.gather(*notifier.submit(reg.change, [1]).values())
        await asyncio.gather(*notifier.submit(ctx.create_topic("a", 2).change, [1]).values())
        # The delta removing "a" is in flight when the broker's heartbeat (at the old version) is answered
        # with its full assignment at the new version.
        peer.hold = asyncio.Event()
        (pushed,) = notifier.submit(ctx.delete_topic("a").change, [1]).values()
        await asyncio.sleep(0.1)
        full = ctx.state.broker_assignment(1)
        assert full.full
        assert not full.remove  # a full assignment alone never says what to delete
        answer = notifier.with_owed_removals(1, full)
        assert {(r.topic, r.partition) for r in answer.remove} == {("a", 0), ("a", 1)}
        # The heartbeat's answer lands first; the delta then arrives stale and is ignored, so only the
        # heartbeat's answer could have told the broker to delete the data.
        peer.version = answer.metadata_version
        peer.hold.set()
        assert await pushed is None
        assert peer.version == ctx.state.metadata_version
        # Nothing owed once the push is acknowledged, and nothing added to a delta.
        assert not notifier.with_owed_removals(1, ctx.state.broker_assignment(1)).remove


def test_a_heartbeat_answer_that_overtakes_a_removal_carries_it() -> None:
    asyncio.run(_heartbeat_overtakes_scenario())


async def _owed_then_assigned_scenario() -> None:
    async with _pushing(5.0) as (peer, port, ctx, notifier):

        async def pushed(change: MetadataChange | None) -> None:
            """Push ``change`` to broker 1 and wait until the peer holds its version."""
            assert change is not None
            notifier.submit(change, [1])
            for _ in range(200):
                if peer.version == change.version:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError(f"the peer never reached version {change.version} (at {peer.version})")

        notifier.registered(1, Endpoint("127.0.0.1", port), known_version=0)
        await pushed(ctx.register_broker(1, port=port).change)
        await pushed(ctx.register_broker(2).change)
        for name in ("a", "b"):
            await pushed(ctx.create_topic(name, 1).change)
        name = next(n for n in ("a", "b") if ctx.state.topics[n].states[0].replicas == (2,))
        # Broker 1 is owed the removal of a stray copy of the partition now on broker 2 ...
        notifier.owe_removals(1, [ctx.state.topics[name].ref(0)])
        # ... which then moves to broker 1: the delta assigning it cancels the owed removal, so no later
        # update deletes the replica broker 1 now holds.
        moved = ctx.apply(start_reassignments(ctx.state, [Reassignment(name, 0, (1,))], 0, ctx.now_ms))
        await pushed(moved.change)
        await pushed(ctx.create_topic("c", 1).change)
        assert not peer.received[-1].full  # deltas all the way: the path that carries owed removals
        assert not any(r.topic == name for request in peer.received for r in request.remove)
        assert (name, 0) in peer.partitions


def test_an_owed_removal_is_dropped_when_the_partition_is_assigned_to_the_broker_again() -> None:
    asyncio.run(_owed_then_assigned_scenario())
