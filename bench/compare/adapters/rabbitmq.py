"""RabbitMQ over AMQP 0-9-1 with aiormq (the protocol layer under aio-pika; aio-pika's own wrapper cost
a third of the rate on this machine): publisher confirms awaited in windows (at most 1,000 records in
flight), persistent messages; consumers with prefetch 1,000 that acknowledge with ``multiple`` every half
window and at the end of a burst.

``queue_type`` "classic": a durable classic queue (a confirm comes once the message is on disk);
"stream": a stream queue, read from its first offset (a stream consumer needs a prefetch and acks).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from compare.adapters.acks import AckWindow
from compare.adapters.base import Adapter, Endpoint
from compare.workload import KEY_BYTES, Feed, Sink, sent_at

WINDOW = 1000
PREFETCH = 1000
ACK_EVERY = PREFETCH // 2


@dataclass
class RabbitMQ(Adapter):
    queue_type: str = "classic"

    def _arguments(self) -> dict[str, Any]:
        return {"x-queue-type": self.queue_type}

    def prepare(self, endpoint: Endpoint, dest: str) -> None:
        asyncio.run(self._declare(endpoint, dest, delete=False))

    def cleanup(self, endpoint: Endpoint, dest: str) -> None:
        asyncio.run(self._declare(endpoint, dest, delete=True))

    async def _declare(self, endpoint: Endpoint, dest: str, delete: bool) -> None:
        import aiormq

        connection = await aiormq.connect(endpoint["url"])
        channel = await connection.channel()
        if delete:
            await channel.queue_delete(dest)
        else:
            await channel.queue_declare(dest, durable=True, arguments=self._arguments())
        await connection.close()

    async def produce(self, endpoint: Endpoint, dest: str, feed: Feed) -> None:
        import aiormq

        connection = await aiormq.connect(endpoint["url"])
        channel = await connection.channel(publisher_confirms=True)
        persistent = aiormq.spec.Basic.Properties(delivery_mode=2)
        publish = channel.basic_publish
        window = AckWindow(feed, WINDOW)
        while not feed.done:
            records = await feed.abatch(WINDOW)
            if records:
                confirms = (
                    publish(key + value, routing_key=dest, properties=persistent) for key, value in records
                )
                await window.add(asyncio.gather(*confirms), sent_at(records[0][1]), len(records))
        await window.drain()
        await connection.close()

    async def consume(self, endpoint: Endpoint, dest: str, sink: Sink) -> None:
        import aiormq
        from aiormq.abc import DeliveredMessage

        connection = await aiormq.connect(endpoint["url"])
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=PREFETCH)
        pending = [0, 0]  # the last delivery tag, messages not acknowledged yet

        async def on_message(message: DeliveredMessage) -> None:
            body = message.body
            sink.add(body[:KEY_BYTES], body[KEY_BYTES:])
            pending[0] = message.delivery_tag or 0
            pending[1] += 1
            if pending[1] >= ACK_EVERY:
                pending[1] = 0
                await channel.basic_ack(pending[0], multiple=True)

        offset: dict[str, Any] | None = {"x-stream-offset": "first"} if self.queue_type == "stream" else None
        await channel.basic_consume(dest, on_message, no_ack=False, arguments=offset)
        while not sink.finished():
            await asyncio.sleep(0.02)
            if pending[1]:  # the tail of a window, or a paced run's few records
                pending[1] = 0
                await channel.basic_ack(pending[0], multiple=True)
        await connection.close()
