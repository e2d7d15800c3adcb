"""RabbitMQ over AMQP 0-9-1 (aio-pika): publisher confirms awaited in windows, persistent messages;
consumers with prefetch 1,000 that acknowledge with ``multiple`` every half window.

``queue_type`` "classic": a durable classic queue (a confirm comes once the message is on disk);
"stream": a stream queue, read from its first offset (a stream consumer needs a prefetch and acks).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

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
        asyncio.run(self._prepare(endpoint, dest))

    async def _prepare(self, endpoint: Endpoint, dest: str) -> None:
        import aio_pika

        async with await aio_pika.connect(endpoint["url"]) as connection:
            channel = await connection.channel()
            await channel.declare_queue(dest, durable=True, arguments=self._arguments())

    def cleanup(self, endpoint: Endpoint, dest: str) -> None:
        asyncio.run(self._cleanup(endpoint, dest))

    async def _cleanup(self, endpoint: Endpoint, dest: str) -> None:
        import aio_pika

        async with await aio_pika.connect(endpoint["url"]) as connection:
            channel = await connection.channel()
            await channel.queue_delete(dest)

    async def produce(self, endpoint: Endpoint, dest: str, feed: Feed) -> None:
        import aio_pika

        async with await aio_pika.connect(endpoint["url"]) as connection:
            channel = await connection.channel(publisher_confirms=True)
            exchange = channel.default_exchange
            persistent = aio_pika.DeliveryMode.PERSISTENT
            while not feed.done:
                records = await feed.abatch(WINDOW)
                if not records:
                    continue
                confirms = [
                    asyncio.ensure_future(
                        exchange.publish(aio_pika.Message(key + value, delivery_mode=persistent), dest)
                    )
                    for key, value in records
                ]
                await asyncio.gather(*confirms)
                feed.acked(sent_at(records[0][1]), len(records))

    async def consume(self, endpoint: Endpoint, dest: str, sink: Sink) -> None:
        import aio_pika
        from aio_pika.abc import AbstractIncomingMessage

        async with await aio_pika.connect(endpoint["url"]) as connection:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=PREFETCH)
            queue = await channel.declare_queue(dest, durable=True, arguments=self._arguments())
            unacked: list[AbstractIncomingMessage] = []

            async def on_message(message: AbstractIncomingMessage) -> None:
                body = message.body
                sink.add(body[:KEY_BYTES], body[KEY_BYTES:])
                unacked.append(message)
                if len(unacked) >= ACK_EVERY:
                    await unacked[-1].ack(multiple=True)
                    unacked.clear()

            offset = {"x-stream-offset": "first"} if self.queue_type == "stream" else None
            tag = await queue.consume(on_message, arguments=offset)
            while not sink.finished():
                await asyncio.sleep(0.02)
                if unacked:  # the tail of a window, or a paced run's few records
                    last = unacked[-1]
                    unacked.clear()
                    await last.ack(multiple=True)
            await queue.cancel(tag)
