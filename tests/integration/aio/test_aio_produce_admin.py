"""sluice.aio against a real stack: the producer (send, enqueue, flush, typed errors) and the admin."""

from __future__ import annotations

import asyncio

import pytest

from sluice import aio
from sluice.errors import InvalidArgument, TopicAlreadyExists, UnknownTopicOrPartition
from tests.integration.aio.conftest import Stack, name


def test_send_waits_for_the_acknowledgement_and_enqueue_does_not(stack: Stack) -> None:
    topic = stack.topic(partitions=2)

    async def main() -> None:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            async with client.producer(topic, linger="20ms") as producer:
                meta = await producer.send(b"first", key=b"k", partition=1, headers={"h": b"x"})
                assert (meta.topic, meta.partition, meta.offset) == (topic, 1, 0)
                futures = [await producer.enqueue(f"v{i}".encode(), partition=0) for i in range(500)]
                assert not all(f.done() for f in futures)  # queued, lingering: not acknowledged yet
                metas = await asyncio.gather(*futures)
                assert [m.offset for m in metas] == list(range(500))
                await producer.enqueue(b"last", partition=0)
                await producer.flush()
            assert producer.closed
            offsets = await client.list_offsets(topic, "latest")
            assert offsets == {0: 501, 1: 1}

    asyncio.run(main())


def test_producer_errors_are_the_sync_sdks_typed_errors(stack: Stack) -> None:
    topic = stack.topic(partitions=2)

    async def main() -> None:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            with pytest.raises(UnknownTopicOrPartition):
                await client.producer(name("missing"))
            with pytest.raises(InvalidArgument):
                await client.producer(topic, linger="soon")
            async with client.producer(topic) as producer:
                with pytest.raises(UnknownTopicOrPartition):
                    await producer.send(b"v", partition=7)
                with pytest.raises(InvalidArgument):
                    await producer.send(b"v", tag="no spaces allowed")

    asyncio.run(main())


def test_admin_methods_are_the_sync_ones_awaited(stack: Stack) -> None:
    topic = name("admin")

    async def main() -> None:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            info = await client.admin.create_topic(topic, partitions=3)
            assert len(info.partitions) == 3
            with pytest.raises(TopicAlreadyExists):
                await client.admin.create_topic(topic, partitions=3)
            assert topic in {t.name for t in await client.admin.list_topics()}
            assert len((await client.admin.describe_topic(topic)).partitions) == 3
            md = await client.metadata([topic], refresh=True)
            assert len(md.topic(topic).partitions) == 3
            await client.admin.delete_topic(topic)
            with pytest.raises(UnknownTopicOrPartition):
                await client.admin.describe_topic(topic)
            with pytest.raises(AttributeError):
                client.admin.no_such_method  # noqa: B018

    asyncio.run(main())
