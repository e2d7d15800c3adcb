"""Poison-key parking from the asyncio SDK (docs/poison-keys.md, "Pull consumers"): the same ``fail()`` /
``is_parked()`` as the sync consumer, on the same implementation (the sync ``poll()`` in a worker
thread), and a cancelled poll loses none of the records its worker thread took."""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict

from sluice import Client, aio
from sluice.retry.levels import dlq_topic
from tests.integration.aio.conftest import FAST, Stack, name
from tests.integration.retry.conftest import read_all

POISON = b"poison"
PARK = {
    **FAST,
    "auto_offset_reset": "earliest",
    "park_poison_keys": True,
    "max_redeliver": 1,
    "park_retry_delay": "100ms",
}


def test_aio_fail_parks_the_key_and_its_records_reach_the_dlq_in_order(stack: Stack) -> None:
    topic, group = stack.topic(1), name("apark")
    sent: dict[bytes, list[bytes]] = defaultdict(list)
    with Client(stack.bootstrap, request_timeout=10) as c, c.producer(topic) as p:
        for i in range(300):
            key = POISON if i % 10 == 0 else f"k{i % 7}".encode()
            p.send(f"{key.decode()}-{i}".encode(), key=key)
            sent[key].append(f"{key.decode()}-{i}".encode())
    good: dict[bytes, list[bytes]] = defaultdict(list)
    tries: list[bytes] = []

    async def main() -> None:
        async with (
            aio.Client(stack.bootstrap, request_timeout=10) as client,
            client.consumer(group, [topic], **PARK) as consumer,
        ):
            deadline = time.monotonic() + 30
            dlq: list[bytes] = []
            while len(dlq) < len(sent[POISON]):
                assert time.monotonic() < deadline, f"{len(dlq)} of {len(sent[POISON])} in the DLQ"
                for r in await consumer.poll(0.2):
                    if consumer.is_parked(r):
                        continue
                    if r.key == POISON:
                        tries.append(r.value)
                        await consumer.fail(r)
                    else:
                        good[r.key].append(r.value)  # type: ignore[index]
                with Client(stack.bootstrap, request_timeout=10) as c:
                    dlq = [r.value for r in read_all(c, dlq_topic(group))]
            assert dlq == sent[POISON], "the poison key's records in the DLQ, in order, once"

    asyncio.run(main())
    assert dict(good) == {k: v for k, v in sent.items() if k != POISON}, "every good record once, in order"
    # Only heads were tried (each 1 + max_redeliver times), not every poison record.
    assert set(Counter(tries).values()) == {2}, tries
    assert len(tries) < len(sent[POISON])


def test_a_cancelled_parking_poll_hands_its_records_to_the_next_poll(stack: Stack) -> None:
    topic, group = stack.topic(1), name("apark")

    async def main() -> list[bytes]:
        async with (
            aio.Client(stack.bootstrap, request_timeout=10) as client,
            client.consumer(group, [topic], **PARK) as consumer,
        ):
            # The worker thread waits for records; the task awaiting it is cancelled meanwhile.
            task = asyncio.create_task(consumer.poll(10.0))
            await asyncio.sleep(0.3)
            task.cancel()
            with Client(stack.bootstrap, request_timeout=10) as c, c.producer(topic) as p:
                for i in range(20):
                    p.send(f"v{i}".encode(), key=b"k")
            got: list[bytes] = []
            deadline = time.monotonic() + 15
            while len(got) < 20:
                assert time.monotonic() < deadline, f"{len(got)} of 20"
                got += [r.value for r in await consumer.poll(0.2)]
            return got

    assert asyncio.run(main()) == [f"v{i}".encode() for i in range(20)], "each record once, in order"
