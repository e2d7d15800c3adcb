"""Serializers and compression through ``sluice.aio`` (issue 18: "the same names, options and errors as
the sync SDK"): an aio producer with ``key_serializer``/``value_serializer`` and ``compression="zstd"``;
an aio group consumer whose ``getmany()`` and ``async for`` raise DeserializationError with the raw record
for each bad one, once, and go on; an aio push consumer whose message raises it from ``.value``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sluice import Client, aio
from sluice.errors import DeserializationError
from tests.integration.aio.conftest import FAST, Stack, name

POISON = b"\xff not json"
N = 12
BAD = {0, 4, 5, 11}  # first, two in a row, last


async def _produce(stack: Stack, topic: str) -> None:
    """Offsets 0..N-1 of partition 0: JSON from the aio producer, compressed; raw poison at BAD."""
    async with (
        aio.Client(stack.bootstrap, request_timeout=10) as client,
        client.producer(
            topic, value_serializer="json", key_serializer="str", compression="zstd", linger=0
        ) as js,
    ):
        with Client(stack.bootstrap, request_timeout=10) as sync, sync.producer(topic, linger=0) as raw:
            for i in range(N):
                if i in BAD:
                    meta = raw.send(POISON, key=b"k", partition=0).result(10)  # set-up: the sync SDK
                else:
                    meta = await js.send({"i": i}, key=f"k{i}", partition=0)
                assert meta.offset == i


def _check(good: dict[int, Any], bad: list[DeserializationError], topic: str) -> None:
    assert good == {i: ("k" + str(i), {"i": i}) for i in range(N) if i not in BAD}
    assert [e.offset for e in bad] == sorted(BAD)
    for e in bad:
        assert (e.topic, e.partition, e.raw_key, e.raw_value) == (topic, 0, b"k", POISON)


def test_getmany_and_async_for_raise_each_bad_record_once_and_go_on(stack: Stack) -> None:
    topic = stack.topic(1)

    async def main() -> None:
        await _produce(stack, topic)
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            opts: dict[str, Any] = {
                "auto_offset_reset": "earliest",
                "enable_auto_commit": False,
                "value_deserializer": "json",
                "key_deserializer": "str",
                **FAST,
            }
            # getmany(): the error is raised alone; the next call goes on after it.
            good: dict[int, Any] = {}
            bad: list[DeserializationError] = []
            async with client.consumer(name("g"), topic, **opts) as consumer:
                deadline = time.monotonic() + 30
                while len(good) + len(bad) < N and time.monotonic() < deadline:
                    try:
                        batches = await consumer.getmany(timeout_ms=300)
                    except DeserializationError as exc:
                        bad.append(exc)
                        continue
                    for records in batches.values():
                        good.update({r.offset: (r.key, r.value) for r in records})
                _check(good, bad, topic)
                assert await consumer.commit() == {(topic, 0): N}

            # async for: a bad record ends that loop with the error; a new loop goes on after it.
            good, bad = {}, []
            async with client.consumer(name("g"), topic, **opts) as consumer:
                deadline = time.monotonic() + 30
                while len(good) + len(bad) < N and time.monotonic() < deadline:
                    try:
                        async for r in consumer:
                            good[r.offset] = (r.key, r.value)
                            if len(good) + len(bad) == N:
                                break
                    except DeserializationError as exc:
                        bad.append(exc)
                _check(good, bad, topic)

    asyncio.run(main())


def test_a_push_message_that_fails_raises_from_value_and_is_acked_as_usual(stack: Stack) -> None:
    topic = stack.topic(1)

    async def main() -> None:
        await _produce(stack, topic)
        async with (
            aio.Client(stack.bootstrap, request_timeout=10) as client,
            client.push_consumer(
                topic, "s", initial_position="earliest", value_deserializer="json", key_deserializer="str"
            ) as pc,
        ):
            good: dict[int, Any] = {}
            bad: list[DeserializationError] = []
            deadline = time.monotonic() + 30
            while len(good) + len(bad) < N and time.monotonic() < deadline:
                msg = await pc.receive(timeout=1.0)
                try:
                    good[msg.offset] = (msg.key, msg.value)
                except DeserializationError as exc:
                    bad.append(exc)
                pc.ack(msg)
            _check(good, bad, topic)

    asyncio.run(main())
