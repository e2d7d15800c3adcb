"""sluice.aio's bulk APIs against a real stack: ``send_many``/``enqueue_many`` and ``poll_columns``, the
sync ones awaited (the same records, order, metadata and typed errors)."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice import aio
from sluice.errors import InvalidArgument, UnknownTopicOrPartition
from tests.integration.aio.conftest import FAST, Stack, name


def test_send_many_and_poll_columns_round_trip(stack: Stack) -> None:
    topic = stack.topic(partitions=3)
    values = [b"v%d" % i for i in range(600)]
    keys = [b"k%d" % (i % 11) for i in range(600)]
    headers = [{"i": b"%d" % i} if i % 4 == 0 else None for i in range(600)]

    async def main() -> None:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            async with client.producer(topic, linger="5ms") as producer:
                metas = await producer.send_many(values[:300], keys[:300], headers=headers[:300])
                assert len(metas) == 300
                pending = await producer.enqueue_many(values[300:], keys[300:], headers=headers[300:])
                metas += await pending
                with pytest.raises(InvalidArgument):
                    await producer.send_many(values, keys[:1])
                with pytest.raises(UnknownTopicOrPartition):
                    await producer.send_many(values, partition=9)
            stored = {(m.partition, m.offset): i for i, m in enumerate(metas)}
            assert len(stored) == 600
            async with client.consumer(name("bulk"), [topic], auto_offset_reset="earliest", **FAST) as c:
                got = 0
                deadline = time.monotonic() + 20
                while got < 600:
                    assert time.monotonic() < deadline, f"polled {got} of 600"
                    for tp, cols in (await c.poll_columns(0.2)).items():
                        assert tp == (topic, cols.partition)
                        for off, key, value, hdrs in zip(
                            cols.offsets, cols.keys, cols.values, cols.headers, strict=True
                        ):
                            i = stored.pop((cols.partition, off))
                            assert (key, value, hdrs) == (keys[i], values[i], headers[i] or {})
                            got += 1
                assert stored == {}
            async with client.consumer(
                name("bulk-ifm"), [topic], commit_mode="in-flight-min", **FAST
            ) as refused:
                with pytest.raises(InvalidArgument, match="poll_columns"):
                    await refused.poll_columns(0.1)

    asyncio.run(main())
