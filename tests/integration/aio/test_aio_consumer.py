"""The asyncio group consumer against a real stack, mirroring the sync suite (tests/integration/consumer):
poll/getmany/getone/async for, commits (sync, async with an async callback), positions, seek, pause and
resume, offset look-ups, async rebalance callbacks, and the typed errors."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice import aio
from sluice.codec.batch import Record
from sluice.errors import InvalidArgument, SluiceError, UnknownTopicOrPartition
from sluice.retry.levels import retry_info, retry_topic
from tests.integration.aio.conftest import FAST, Stack, name

TopicPartition = tuple[str, int]


async def take(consumer: aio.Consumer, n: int, within: float = 15.0) -> list[Record]:
    got: list[Record] = []
    deadline = time.monotonic() + within
    while len(got) < n:
        assert time.monotonic() < deadline, f"timed out with {len(got)} of {n} records"
        for records in (await consumer.getmany(timeout_ms=200)).values():
            got += records
    return got


def values(records: list[Record]) -> list[int]:
    return sorted(int(r.value[1:]) for r in records)


def test_getmany_commit_and_resume_with_async_rebalance_callbacks(stack: Stack) -> None:
    topic = stack.topic(4)
    stack.produce(topic, 40)
    group = name("g")
    assigned: list[list[TopicPartition]] = []
    revoked: list[list[TopicPartition]] = []

    async def on_assign(parts: list[TopicPartition]) -> None:
        await asyncio.sleep(0)  # a real coroutine, run on the loop while poll's worker thread waits
        assigned.append(parts)

    async def on_revoke(parts: list[TopicPartition]) -> None:
        revoked.append(parts)

    async def main() -> None:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            consumer = await client.consumer(
                group,
                [topic],
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                on_assign=on_assign,
                on_revoke=on_revoke,
                **FAST,
            )
            got = await take(consumer, 40)
            assert values(got) == list(range(40))
            assert assigned == [[(topic, p) for p in range(4)]]
            assert consumer.assignment() == {(topic, p) for p in range(4)}
            assert all(consumer.position((topic, p)) == 10 for p in range(4))
            assert all(consumer.highwater((topic, p)) == 10 for p in range(4))
            assert await consumer.commit() == {(topic, p): 10 for p in range(4)}
            assert await consumer.committed() == {(topic, p): 10 for p in range(4)}
            await consumer.close()
            assert revoked == [[(topic, p) for p in range(4)]]
            assert await client.admin.group_offsets(group) == {(topic, p): 10 for p in range(4)}

            stack.produce(topic, 8, start=40)
            async with client.consumer(group, [topic], auto_offset_reset="earliest", **FAST) as again:
                assert values(await take(again, 8)) == list(range(40, 48))

    asyncio.run(main())


def test_async_for_commit_async_and_getone(stack: Stack) -> None:
    topic = stack.topic(2)
    stack.produce(topic, 20)
    group = name("g")
    outcomes: list[tuple[dict[TopicPartition, int], SluiceError | None]] = []

    async def on_commit(offsets: dict[TopicPartition, int], error: SluiceError | None) -> None:
        outcomes.append((offsets, error))

    async def main() -> None:
        async with (
            aio.Client(stack.bootstrap, request_timeout=10) as client,
            client.consumer(
                group, topic, auto_offset_reset="earliest", enable_auto_commit=False, **FAST
            ) as consumer,
        ):
            first = await consumer.getone()
            seen = [first]
            async for record in consumer:
                seen.append(record)
                if len(seen) == 20:
                    break
            assert values(seen) == list(range(20))
            # The loop stopped at the 20th record: it is the last one handed out, so it counts as
            # processed by the next commit, and nothing beyond it was taken.
            await consumer.commit_async(callback=on_commit)
            await consumer.commit()  # waits for the async commit first (and runs its callback)
            assert outcomes == [({(topic, 0): 10, (topic, 1): 10}, None)]
            assert await consumer.committed() == {(topic, 0): 10, (topic, 1): 10}

    asyncio.run(main())


def test_seek_pause_resume_and_offset_lookups(stack: Stack) -> None:
    topic = stack.topic(2)
    before = int(time.time() * 1000)
    stack.produce(topic, 10)
    group = name("g")

    async def main() -> None:
        async with (
            aio.Client(stack.bootstrap, request_timeout=10) as client,
            client.consumer(group, [topic], auto_offset_reset="latest", **FAST) as consumer,
        ):
            deadline = time.monotonic() + 15
            while len(consumer.assignment()) < 2:  # joined: poll applies the assignment
                assert time.monotonic() < deadline
                await consumer.poll(0.1)
            tps = sorted(consumer.assignment())
            assert await consumer.end_offsets(tps) == {tp: 5 for tp in tps}
            assert await consumer.beginning_offsets(tps) == {tp: 0 for tp in tps}
            assert await consumer.offsets_for_times({tp: before for tp in tps}) == {tp: 0 for tp in tps}
            await consumer.seek_to_beginning()
            assert values(await take(consumer, 10)) == list(range(10))
            consumer.seek((topic, 1), 3)
            consumer.pause([(topic, 0)])
            assert consumer.paused() == {(topic, 0)}
            again = await take(consumer, 2)
            assert {(r.partition, r.offset) for r in again} == {(1, 3), (1, 4)}
            assert await consumer.getmany(timeout_ms=300) == {}  # partition 0 is paused, 1 at its end
            consumer.resume([(topic, 0)])
            await consumer.seek_to_end((topic, 1))
            assert consumer.position((topic, 1)) == 5
            with pytest.raises(InvalidArgument):
                consumer.seek((topic, 9), 0)

    asyncio.run(main())


def test_consumer_errors_are_the_sync_sdks_typed_errors(stack: Stack) -> None:
    async def main() -> None:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            with pytest.raises(UnknownTopicOrPartition):
                await client.consumer(name("g"), [name("missing")], **FAST)
            with pytest.raises(InvalidArgument):
                await client.consumer(name("g"), ["x"], commit_mode="sometimes")
            topic = stack.topic(1)
            consumer = await client.consumer(name("g"), [topic], **FAST)
            with pytest.raises(InvalidArgument):
                await consumer.poll(0, max_records=0)
            await consumer.close()
            with pytest.raises(SluiceError, match="closed"):
                await consumer.poll(0)

    asyncio.run(main())


def test_close_ends_an_async_for_waiting_in_another_task(stack: Stack) -> None:
    topic = stack.topic(1)

    async def main() -> None:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            consumer = await client.consumer(name("g"), [topic], **FAST)
            seen: list[Record] = []

            async def loop() -> None:
                async for record in consumer:
                    seen.append(record)

            task = asyncio.create_task(loop())
            await asyncio.sleep(0.5)
            started = time.monotonic()
            await consumer.close()
            await asyncio.wait_for(task, 5)  # the iterator stops, no error
            assert time.monotonic() - started < 5
            assert seen == []

    asyncio.run(main())


def test_a_rebalance_between_two_members_calls_async_callbacks_and_loses_nothing(stack: Stack) -> None:
    topic = stack.topic(4)
    stack.produce(topic, 40)
    group = name("g")
    calls: list[tuple[str, str, list[TopicPartition]]] = []

    def listener(member: str) -> object:
        class Listener:
            async def on_assign(self, parts: list[TopicPartition]) -> None:
                calls.append((member, "assign", parts))

            async def on_revoke(self, parts: list[TopicPartition]) -> None:
                await asyncio.sleep(0.01)  # the partitions are released only after this returns
                calls.append((member, "revoke", parts))

        return Listener()

    async def main() -> list[Record]:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            a = await client.consumer(
                group,
                [topic],
                auto_offset_reset="earliest",
                listener=listener("a"),
                max_poll_records=5,
                **FAST,
            )
            got = await take(a, 10)  # a holds all four partitions and has read some
            b = await client.consumer(
                group, [topic], auto_offset_reset="earliest", listener=listener("b"), **FAST
            )
            deadline = time.monotonic() + 20
            while len(got) < 40:
                assert time.monotonic() < deadline, len(got)
                for c in (a, b):
                    for records in (await c.getmany(timeout_ms=100, max_records=5)).values():
                        got += records
            await a.close()
            await b.close()
            return got

    got = asyncio.run(main())
    assert values(got) == list(range(40))  # each record once: revoked partitions were committed first
    revoked = [parts for member, what, parts in calls if (member, what) == ("a", "revoke")]
    b_assigned = [parts for member, what, parts in calls if (member, what) == ("b", "assign")]
    assert revoked
    assert b_assigned
    assert set(revoked[0]) == set(b_assigned[0])  # what a gave up is what b got


def test_reconsume_later_brings_the_record_back(stack: Stack) -> None:
    topic = stack.topic(2)
    group = name("g")

    async def main() -> None:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            async with client.producer(topic) as producer:
                await producer.send(b"fails-once", key=b"k")
            async with client.consumer(
                group,
                [topic],
                auto_offset_reset="earliest",
                retry=True,
                retry_delay_levels=" ".join(["50ms"] * 18),
                **FAST,
            ) as consumer:
                first = await asyncio.wait_for(consumer.getone(), 20)
                assert first.value == b"fails-once"
                outcome = await consumer.reconsume_later(first)
                assert outcome.topic == retry_topic(group)
                again = await asyncio.wait_for(consumer.getone(), 20)  # from the retry topic, when due
                assert (again.topic, again.value) == (retry_topic(group), b"fails-once")
                info = retry_info(again.headers)
                assert info is not None
                assert (info.topic, info.partition, info.offset, info.count) == (topic, first.partition, 0, 1)
                await consumer.commit()

    asyncio.run(main())


def test_subscribe_adds_a_topic_then_drops_one(stack: Stack) -> None:
    a, b = stack.topic(2), stack.topic(2)
    stack.produce(a, 4)
    stack.produce(b, 6)
    group = name("g")
    revoked: list[list[TopicPartition]] = []

    async def on_revoke(parts: list[TopicPartition]) -> None:
        revoked.append(parts)

    async def main() -> None:
        async with (
            aio.Client(stack.bootstrap, request_timeout=10) as client,
            client.consumer(group, a, auto_offset_reset="earliest", on_revoke=on_revoke, **FAST) as consumer,
        ):
            assert {r.topic for r in await take(consumer, 4)} == {a}
            await consumer.subscribe([a, b])
            got = await take(consumer, 6)
            assert ({r.topic for r in got}, values(got)) == ({b}, list(range(6)))
            await consumer.subscribe([b])
            deadline = time.monotonic() + 10
            while consumer.assignment() != {(b, 0), (b, 1)}:
                assert time.monotonic() < deadline, consumer.assignment()
                assert await consumer.getmany(timeout_ms=100) == {}
            assert revoked == [[(a, 0), (a, 1)]]
            with pytest.raises(UnknownTopicOrPartition):
                await consumer.subscribe([f"missing-{b}"])

    asyncio.run(main())
