"""NATS JetStream: async publish with the acks awaited in windows (at most 1,000 in flight); a durable
pull consumer fetching 1,000 at a time, acknowledging each fetched batch by its last message (ack policy
``all``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from compare.adapters.acks import AckWindow
from compare.adapters.base import Adapter, Endpoint
from compare.workload import KEY_BYTES, Feed, Sink, sent_at

#: Publishes in flight before their acks are awaited (nats-py's own stall limit is 4,000).
WINDOW = 1000
FETCH = 1000


@dataclass
class NatsJetStream(Adapter):
    def prepare(self, endpoint: Endpoint, dest: str) -> None:
        asyncio.run(self._prepare(endpoint, dest))

    async def _prepare(self, endpoint: Endpoint, dest: str) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

        nc = await nats.connect(endpoint["url"])
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=dest, subjects=[dest], storage=StorageType.FILE))
        await js.add_consumer(
            dest, ConsumerConfig(durable_name="c", ack_policy=AckPolicy.ALL, max_ack_pending=-1)
        )
        await nc.close()

    def cleanup(self, endpoint: Endpoint, dest: str) -> None:
        asyncio.run(self._cleanup(endpoint, dest))

    async def _cleanup(self, endpoint: Endpoint, dest: str) -> None:
        import nats

        nc = await nats.connect(endpoint["url"])
        await nc.jetstream().delete_stream(dest)
        await nc.close()

    async def produce(self, endpoint: Endpoint, dest: str, feed: Feed) -> None:
        import nats

        nc = await nats.connect(endpoint["url"])
        js = nc.jetstream(publish_async_max_pending=4 * WINDOW)
        window = AckWindow(feed, WINDOW)
        while not feed.done:
            for key, value in await feed.abatch(WINDOW):
                await window.add(await js.publish_async(dest, key + value, stream=dest), sent_at(value))
        await window.drain()
        await nc.close()

    async def consume(self, endpoint: Endpoint, dest: str, sink: Sink) -> None:
        import nats
        from nats.errors import TimeoutError as NatsTimeout

        nc = await nats.connect(endpoint["url"])
        sub = await nc.jetstream().pull_subscribe_bind("c", stream=dest)
        while not sink.finished():
            try:
                msgs = await sub.fetch(FETCH, timeout=0.5)
            except (NatsTimeout, TimeoutError):
                continue
            data = [msg.data for msg in msgs]
            sink.add_many([d[:KEY_BYTES] for d in data], [d[KEY_BYTES:] for d in data])
            if msgs:  # a fetch can answer empty (its request expired on the server)
                await msgs[-1].ack()
        await nc.close()
