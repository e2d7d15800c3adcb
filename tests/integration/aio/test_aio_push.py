"""The asyncio push consumer against a real dispatcher, mirroring tests/integration/push: receive, async for
with acks, nack and redelivery, the typed errors, close ending an iteration."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice import aio
from sluice.client.push import Message
from sluice.errors import ConsumerBusy, RequestTimedOut, SubscriptionTypeMismatch, UnknownTopicOrPartition
from tests.integration.aio.conftest import Stack, name


def test_async_for_with_acks_and_a_nack_redelivered(stack: Stack) -> None:
    topic = stack.topic(4)
    stack.produce(topic, 20)

    async def main() -> None:
        async with (
            aio.Client(stack.bootstrap, request_timeout=10) as client,
            client.push_consumer(
                topic, name("s"), "shared", initial_position="earliest", nack_delay="100ms"
            ) as pc,
        ):
            got: list[Message] = []
            nacked = False
            async for msg in pc:
                if msg.value == b"v7" and not nacked:
                    pc.nack(msg)  # comes again after nack_delay
                    nacked = True
                    continue
                pc.ack(msg)
                got.append(msg)
                if len(got) == 20:
                    break
            assert sorted(int(m.value[1:]) for m in got) == list(range(20))
            assert next(m for m in got if m.value == b"v7").redelivery_count == 1
            with pytest.raises(RequestTimedOut):
                await pc.receive(timeout=0.3)
            assert pc.stats().acked == 20

    asyncio.run(main())


def test_push_errors_are_the_sync_sdks_typed_errors(stack: Stack) -> None:
    topic = stack.topic(2)

    async def main() -> None:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            sub = name("s")
            async with client.push_consumer(topic, sub, "exclusive"):
                with pytest.raises(ConsumerBusy):
                    await client.push_consumer(topic, sub, "exclusive")
                with pytest.raises(SubscriptionTypeMismatch):
                    await client.push_consumer(topic, sub, "shared")
            with pytest.raises(UnknownTopicOrPartition):
                await client.push_consumer(name("missing"), "s", "shared")

    asyncio.run(main())


def test_close_ends_an_async_for_waiting_in_another_task(stack: Stack) -> None:
    topic = stack.topic(1)

    async def main() -> None:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            pc = await client.push_consumer(topic, name("s"), "shared")
            seen: list[Message] = []

            async def loop() -> None:
                async for msg in pc:
                    seen.append(msg)

            task = asyncio.create_task(loop())
            await asyncio.sleep(0.3)
            started = time.monotonic()
            await pc.close()
            await asyncio.wait_for(task, 5)
            assert time.monotonic() - started < 5
            assert seen == []

    asyncio.run(main())
