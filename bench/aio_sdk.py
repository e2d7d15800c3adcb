"""What the asyncio SDK costs over the sync one it wraps (docs/asyncio.md, "Costs").

One stack (coordinator, broker, offset store, dispatcher); records of 100 B on 4 partitions. Measured in
this one process, one after the other:

* produce: the sync ``send()`` then ``flush()``, against ``await producer.enqueue()`` then ``flush()``,
  and against keeping every future and awaiting them all (``asyncio.gather``);
* sequential sends: ``send().result()`` against ``await producer.send()``, one record in flight;
* group consume: the sync ``poll()`` loop and ``for record in consumer``, against ``getmany()`` and
  ``async for`` (one record per step), each a fresh group reading the whole topic.

    python bench/aio_sdk.py --records 200000
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from _stack import save, stack
from sluice import Client, aio

VALUE = b"x" * 100


def sync_produce(bootstrap: str, topic: str, n: int) -> float:
    with Client(bootstrap) as client, client.producer(topic, linger="5ms") as p:
        started = time.perf_counter()
        for i in range(n):
            p.send(VALUE, key=str(i % 1000).encode())
        p.flush()
        return n / (time.perf_counter() - started)


async def aio_produce(bootstrap: str, topic: str, n: int, gather: bool) -> float:
    """``gather``: keep every record's future and await them all; else drop them and ``flush()``."""
    async with aio.Client(bootstrap) as client, client.producer(topic, linger="5ms") as p:
        started = time.perf_counter()
        if gather:
            futures = [await p.enqueue(VALUE, key=str(i % 1000).encode()) for i in range(n)]
            await asyncio.gather(*futures)
        else:
            for i in range(n):
                await p.enqueue(VALUE, key=str(i % 1000).encode())
            await p.flush()
        return n / (time.perf_counter() - started)


def sync_sequential(bootstrap: str, topic: str, n: int) -> float:
    with Client(bootstrap) as client, client.producer(topic) as p:
        started = time.perf_counter()
        for _ in range(n):
            p.send(VALUE).result()
        return (time.perf_counter() - started) / n * 1e6


async def aio_sequential(bootstrap: str, topic: str, n: int) -> float:
    async with aio.Client(bootstrap) as client, client.producer(topic) as p:
        started = time.perf_counter()
        for _ in range(n):
            await p.send(VALUE)
        return (time.perf_counter() - started) / n * 1e6


def sync_consume(bootstrap: str, topic: str, n: int, group: str, iterate: bool) -> float:
    with Client(bootstrap) as client:
        c = client.consumer(group, [topic], auto_offset_reset="earliest")
        got = 0
        started = time.perf_counter()
        if iterate:
            for _ in c:
                got += 1
                if got == n:
                    break
        else:
            while got < n:
                got += len(c.poll(1.0))
        rate = n / (time.perf_counter() - started)
        c.close()
        return rate


async def aio_consume(bootstrap: str, topic: str, n: int, group: str, iterate: bool) -> float:
    async with aio.Client(bootstrap) as client:
        c = await client.consumer(group, [topic], auto_offset_reset="earliest")
        got = 0
        started = time.perf_counter()
        if iterate:
            async for _ in c:
                got += 1
                if got == n:
                    break
        else:
            while got < n:
                got += sum(len(rs) for rs in (await c.getmany(timeout_ms=1000)).values())
        rate = n / (time.perf_counter() - started)
        await c.close()
        return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--sequential", type=int, default=2_000)
    args = parser.parse_args()
    n = args.records
    out: dict[str, Any] = {"records": n, "value_bytes": len(VALUE)}
    with stack(push=True) as s:
        with Client(s.bootstrap) as admin:
            for t in ("bench", "bench-mixed"):
                admin.admin.create_topic(t, partitions=4)
        out["produce_sync_rec_s"] = round(sync_produce(s.bootstrap, "bench", n))
        out["produce_aio_flush_rec_s"] = round(asyncio.run(aio_produce(s.bootstrap, "bench", n, False)))
        out["produce_aio_gather_rec_s"] = round(asyncio.run(aio_produce(s.bootstrap, "bench", n, True)))
        seq = args.sequential
        out["send_wait_sync_us"] = round(sync_sequential(s.bootstrap, "bench-mixed", seq), 1)
        out["send_wait_aio_us"] = round(asyncio.run(aio_sequential(s.bootstrap, "bench-mixed", seq)), 1)
        total = 3 * n  # the three produce runs wrote to "bench"
        out["consume_poll_sync_rec_s"] = round(sync_consume(s.bootstrap, "bench", total, "g-a", False))
        out["consume_iter_sync_rec_s"] = round(sync_consume(s.bootstrap, "bench", total, "g-b", True))
        out["consume_getmany_aio_rec_s"] = round(
            asyncio.run(aio_consume(s.bootstrap, "bench", total, "g-c", False))
        )
        out["consume_async_for_aio_rec_s"] = round(
            asyncio.run(aio_consume(s.bootstrap, "bench", total, "g-d", True))
        )
    save("aio_sdk", out)


if __name__ == "__main__":
    main()
