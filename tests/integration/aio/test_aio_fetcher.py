"""The asyncio low-level fetcher (manual assignment without a group, aiokafka's ``assign()``) against a real
stack: fetch from given offsets, positions, seek back, remove, a broker-side filter; and cancelling
``fetch()`` at random moments while records flow loses no record and repeats none (a cancelled fetch's
records are kept for the next one)."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

from sluice import aio
from sluice.codec.batch import Record
from tests.integration.aio.conftest import Stack
from tests.integration.aio.test_aio_cancellation import feed

N = 2000


async def take(fetcher: aio.Fetcher, n: int, within: float = 15.0) -> list[Record]:
    got: list[Record] = []
    deadline = time.monotonic() + within
    while len(got) < n:
        assert time.monotonic() < deadline, f"timed out with {len(got)} of {n} records"
        got += await fetcher.fetch(timeout=0.2)
    return got


def test_fetch_seek_remove_and_filter(stack: Stack) -> None:
    topic = stack.topic(2)
    stack.produce(topic, 40)  # round robin: 20 per partition

    async def main() -> None:
        async with (
            aio.Client(stack.bootstrap, request_timeout=10) as client,
            client.fetcher({(topic, 0): 0, (topic, 1): 5}) as fetcher,
        ):
            got = await take(fetcher, 35)
            assert sorted((r.partition, r.offset) for r in got) == sorted(
                [(0, o) for o in range(20)] + [(1, o) for o in range(5, 20)]
            )
            assert fetcher.positions() == {(topic, 0): 20, (topic, 1): 20}
            assert [fetcher.highwater((topic, p)) for p in (0, 1, 2)] == [20, 20, None]  # 2: not fetched
            await fetcher.seek((topic, 0), 15)
            await fetcher.remove((topic, 1))
            again = await take(fetcher, 5)
            assert sorted((r.partition, r.offset) for r in again) == [(0, o) for o in range(15, 20)]
            assert fetcher.positions() == {(topic, 0): 20}
            await fetcher.set_filter(topic, "nothing-has-this-tag")
            await fetcher.seek((topic, 0), 0)
            assert await fetcher.fetch(timeout=0.5) == []  # the broker filtered every record out

    asyncio.run(main())


def test_cancelled_fetches_lose_no_record(stack: Stack) -> None:
    topic = stack.topic(4)
    rng = random.Random(20)

    async def main() -> tuple[Counter[bytes], int, int]:
        async with aio.Client(stack.bootstrap, request_timeout=10) as client:
            fetcher = client.fetcher({(topic, p): 0 for p in range(4)}, max_wait_ms=50)
            producing = asyncio.create_task(feed(client, topic, N))
            seen: Counter[bytes] = Counter()
            cancelled = completed = 0
            deadline = time.monotonic() + 60
            while sum(seen.values()) < N and time.monotonic() < deadline:
                task = asyncio.ensure_future(fetcher.fetch(timeout=rng.choice((None, 0.005, 0.05))))
                await asyncio.sleep(rng.choice((0, 0, 0.0005, 0.002, 0.01)))
                task.cancel()
                try:
                    got = await task
                except asyncio.CancelledError:
                    cancelled += 1
                    continue
                completed += 1
                seen.update(r.value for r in got)
            await producing
            ends = await client.list_offsets(topic, "latest")
            assert fetcher.positions() == {(topic, p): end for p, end in ends.items()}
            await fetcher.close()
            return seen, cancelled, completed

    seen, cancelled, completed = asyncio.run(main())
    assert cancelled >= 50, cancelled  # the test did cancel fetches, many times
    assert completed >= 10, completed
    assert sum(seen.values()) == N
    assert set(seen) == {f"v{i}".encode() for i in range(N)}
    assert max(seen.values()) == 1
