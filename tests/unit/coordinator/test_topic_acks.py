"""What a topic change answers: a broker's error fails it, silence degrades it, a heartbeat settles a push
that timed out. Over a real gRPC broker peer (the coordinator contract) and the real notifier."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from coordinator_context import ClusterContext
from grpc import aio
from tests.broker_peer import CoordinatorFacingBroker

from sluice.common.rpc import ERROR_CODE_KEY
from sluice.coordinator.broker_updates import BrokerNotifier, PushFailure
from sluice.coordinator.cluster.model import Endpoint, TopicConfig
from sluice.coordinator.topic_acks import Incomplete, IncompleteTopics, wait_for_brokers
from sluice.errors import BrokerNotAvailable, BrokerUpdateFailed, StorageError
from sluice.v1 import broker_pb2, broker_pb2_grpc


class SlowOrBrokenBroker(CoordinatorFacingBroker):
    """Applies nothing; answers after ``delay_s``, or with a typed error when ``error`` is set."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.error: StorageError | None = None

    async def UpdatePartitions(
        self, request: broker_pb2.UpdatePartitionsRequest, context: aio.ServicerContext[Any, Any]
    ) -> broker_pb2.UpdatePartitionsResponse:
        await asyncio.sleep(self.delay_s)
        if self.error is not None:
            trailer = ((ERROR_CODE_KEY, str(self.error.code)),)
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.error.message, trailer)
        return broker_pb2.UpdatePartitionsResponse()


def test_record_fails_on_an_answered_error_and_degrades_on_silence() -> None:
    topics = IncompleteTopics()
    incomplete = Incomplete("create", "id", 3, TopicConfig(), {})
    assert topics.record("t", {}, incomplete, "create topic t") == ()
    silent = topics.record("t", {2: PushFailure("no answer within 3s")}, incomplete, "create topic t")
    assert [type(e) for e in silent] == [BrokerNotAvailable]
    assert "broker 2" in silent[0].message
    assert topics.lookup("t", "create") is None  # a degraded success is not retried: it succeeded
    with pytest.raises(BrokerUpdateFailed, match=r"broker 1: STORAGE_ERROR: disk full"):
        topics.record(
            "t",
            {1: PushFailure("STORAGE_ERROR: disk full", answered=True), 2: PushFailure("no answer")},
            incomplete,
            "create topic t",
        )
    assert topics.lookup("t", "create") == incomplete  # so the same request again pushes it again
    assert topics.lookup("t", "delete") is None


def test_a_push_that_timed_out_is_settled_by_the_next_heartbeat_and_an_error_is_final() -> None:
    asyncio.run(_scenario())


async def _scenario() -> None:
    peer = SlowOrBrokenBroker()
    server = aio.server()
    broker_pb2_grpc.add_BrokerServicer_to_server(peer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ctx = ClusterContext()
    notifier = BrokerNotifier(ctx.state.broker_assignment, timeout_s=0.2)
    try:
        reg = ctx.register_broker(1, port=port)
        notifier.registered(1, Endpoint("127.0.0.1", port), known_version=0)
        assert reg.change is not None
        await asyncio.gather(*notifier.submit(reg.change, [1]).values())

        # Slower than the push deadline: not failed yet; the heartbeat reporting the version settles it.
        peer.delay_s = 1.0
        change = ctx.create_topic("slow", 1).change
        acks = notifier.submit(change, [1])
        await asyncio.sleep(0.6)  # past the deadline (0.2 s + 25 ms per partition)
        assert not acks[1].done()
        notifier.observed(1, change.version - 1)  # still behind: keep waiting
        assert not acks[1].done()
        notifier.observed(1, change.version)
        assert await wait_for_brokers(acks, 1.0) == {}

        # A broker that never reports the version: the caller's bound answers "no answer".
        change = ctx.create_topic("silent", 1).change
        failures = await wait_for_brokers(notifier.submit(change, [1]), 0.5)
        assert not failures[1].answered
        assert "no answer" in failures[1].reason

        # A broker that answers it cannot: final at once, with its typed error.
        peer.delay_s, peer.error = 0.0, StorageError("cannot create the log of bad-0")
        notifier.observed(1, ctx.state.metadata_version)
        change = ctx.create_topic("bad", 1).change
        failures = await wait_for_brokers(notifier.submit(change, [1]), 5.0)
        assert failures[1].answered
        assert failures[1].reason == "STORAGE_ERROR: cannot create the log of bad-0"
        # And a broker the change should reach that got no push (not alive) is reported too.
        assert "not alive" in (await wait_for_brokers({}, 0.1, affected=[7]))[7].reason
    finally:
        await notifier.close()
        await server.stop(None)
