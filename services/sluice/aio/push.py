"""The asyncio push consumer: the sync :class:`~sluice.client.push.PushConsumer`, awaited.

::

    async with client.push_consumer("orders", "s", "shared") as pc:
        async for msg in pc:
            await handle(msg)
            pc.ack(msg)

``receive()`` is the sync consumer's own ``receive_async`` (it waits on an asyncio future its
stream threads resolve, then takes the message under the lock with no ``await`` in between, so a
cancelled ``receive()`` loses no message). ``ack``/``nack``/``ack_cumulative`` only queue a command
for the stream's writer, so they are plain calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from sluice.aio.bridge import LoopBridge
from sluice.client.push import Message, PushConsumerConfig, PushConsumerStats
from sluice.client.push import PushConsumer as SyncPushConsumer
from sluice.client.push.consumer import TAKE_BATCH
from sluice.errors import SluiceError

__all__ = ["PushConsumer"]


class PushConsumer:
    """A consumer of a push subscription, for asyncio. Made by ``sluice.aio.Client.push_consumer``."""

    def __init__(self, sync: SyncPushConsumer, bridge: LoopBridge) -> None:
        self._sync = sync
        self._bridge = bridge

    @property
    def sync(self) -> SyncPushConsumer:
        return self._sync

    @property
    def topic(self) -> str:
        return self._sync.topic

    @property
    def subscription(self) -> str:
        return self._sync.subscription

    @property
    def config(self) -> PushConsumerConfig:
        return self._sync.config

    @property
    def closed(self) -> bool:
        return self._sync.closed

    async def receive(self, timeout: float | None = None) -> Message:  # noqa: ASYNC109
        """The next message; waits up to ``timeout`` seconds (None: forever). Raises RequestTimedOut
        when none came, the subscription's typed error, SluiceError when closed."""
        return await self._sync.receive_async(timeout)

    async def receive_many(
        self,
        max_messages: int = 1000,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[Message]:
        """What is queued, up to ``max_messages``, once one message is; waits up to ``timeout``
        seconds for the first (None: forever). ``[]`` when none came (the sync ``receive_many``)."""
        return await self._sync.receive_many_async(max_messages, timeout)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Message]:
        """``async for msg in pc``: messages as they come, until the consumer is closed. Taken in
        batches; what is not yet yielded when the loop is left goes back to the queue."""
        sync = self._sync
        while not sync.closed:
            try:
                msgs = await sync.receive_many_async(TAKE_BATCH, None)
            except SluiceError:
                if sync.closed:
                    return
                raise
            given = 0
            try:
                for msg in msgs:
                    yield msg
                    given += 1
            finally:
                if given < len(msgs):
                    sync.give_back(msgs[given:])

    def ack(self, msg: Message) -> None:
        self._sync.ack(msg)

    def ack_many(self, msgs: list[Message]) -> None:
        self._sync.ack_many(msgs)

    def ack_cumulative(self, msg: Message) -> None:
        self._sync.ack_cumulative(msg)

    def nack(self, msg: Message) -> None:
        self._sync.nack(msg)

    def pause(self) -> None:
        self._sync.pause()

    def resume(self) -> None:
        self._sync.resume()

    @property
    def paused(self) -> bool:
        return self._sync.paused

    @property
    def active_partitions(self) -> frozenset[int]:
        return self._sync.active_partitions

    def stats(self) -> PushConsumerStats:
        return self._sync.stats()

    async def close(self) -> None:
        """The sync ``close()`` (pending acks written, streams ended), in a worker thread."""
        if not self._sync.closed:
            await self._bridge.loop.run_in_executor(None, self._sync.close)

    async def __aenter__(self) -> PushConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<aio {self._sync!r}>"
