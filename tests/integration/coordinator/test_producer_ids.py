"""Producer ids from a real coordinator process: unique across restarts and terms, epochs bumped, rationed
per client, and a deposed coordinator cannot reserve a block."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from tests.harness import run_redis
from tests.integration.coordinator.coordinator_peers import (
    call,
    coordinator_stub,
    run_coordinator,
    typed_error,
)

from sluice.coordinator.producer_ids import BLOCK_SIZE, ProducerIdBlocks
from sluice.errors import InvalidArgument, NotCoordinator, Throttled
from sluice.v1 import coordinator_pb2 as pb


def _new(client: str = "app") -> pb.InitProducerIdRequest:
    return pb.InitProducerIdRequest(client_id=client, producer_id=-1, producer_epoch=-1)


def test_ids_are_unique_across_a_restart_epochs_bump_and_new_ids_are_rationed() -> None:
    with run_redis() as r:
        args = ("--port", "0", "--metrics-port", "0", "--redis-url", r.url, "--producer-ids-per-minute", "5")
        with run_coordinator(*args) as coordinator:
            with coordinator_stub(coordinator.address) as stub:
                first = [call(stub.InitProducerId, _new()) for _ in range(5)]
                ids = [a.producer_id for a in first]
                assert len(set(ids)) == 5
                assert ids == sorted(ids)
                assert {a.producer_epoch for a in first} == {0}
                # The sixth within the minute is refused, naming the wait; another client is not affected.
                error, code = typed_error(stub.InitProducerId, _new())
                assert isinstance(error, Throttled)
                assert code == str(Throttled.code)
                assert "more than 5 new producer ids a minute" in error.message
                other = call(stub.InitProducerId, _new("other-app"))
                # Re-initialising an id is not rationed: the same id under the next epoch.
                bump = pb.InitProducerIdRequest(client_id="app", producer_id=ids[0], producer_epoch=0)
                again = call(stub.InitProducerId, bump)
                assert (again.producer_id, again.producer_epoch) == (ids[0], 1)
                half = pb.InitProducerIdRequest(client_id="app", producer_id=ids[0], producer_epoch=-1)
                error, _ = typed_error(stub.InitProducerId, half)
                assert isinstance(error, InvalidArgument)
            coordinator.stop()
            coordinator.restart()
            with coordinator_stub(coordinator.address) as stub:
                after = call(stub.InitProducerId, _new("after-restart")).producer_id
        # A restarted coordinator starts a fresh block: no id is handed out twice.
        assert after >= max([*ids, other.producer_id]) + 1
        assert after % BLOCK_SIZE == 0


def test_a_deposed_coordinator_cannot_reserve_ids() -> None:
    async def scenario(url: str) -> None:
        client = aioredis.Redis.from_url(url)
        try:
            await client.set("sluice:coordinator:epoch", 7)
            blocks = ProducerIdBlocks(client, "sluice", "sluice:coordinator:epoch")
            assert await blocks.next_id(7) == 0
            assert await blocks.next_id(7) == 1
            await client.set("sluice:coordinator:epoch", 8)  # a newer coordinator took over
            blocks.forget()
            with pytest.raises(NotCoordinator, match="superseded by epoch 8"):
                await blocks.next_id(7)
            assert await blocks.next_id(8) == BLOCK_SIZE
        finally:
            await client.aclose()

    with run_redis() as r:
        asyncio.run(scenario(r.url))
