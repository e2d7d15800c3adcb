"""The asyncio producer: the sync :class:`~sluice.client.producer.Producer`, with asyncio futures.

::

    async with client.producer("orders", linger="5ms") as producer:
        meta = await producer.send(b"v", key=b"k")          # waits for the acknowledgement
        fut = await producer.enqueue(b"w")                  # queued; await fut later

``send``/``enqueue`` call the sync ``send()`` on the loop's thread (it only appends to a batch),
and turn its future into an asyncio future: the sender thread's completion of a batch is posted to the
loop through the :class:`~sluice.aio.bridge.LoopBridge` (one callback per batch, one loop wake-up per
burst of acknowledgements).
Only when ``buffer_memory`` is full (the sync ``send()`` would block) or for a delayed record (its
first one sets up the schedule topic) does the call run in a worker thread.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sluice.aio.bridge import LoopBridge
from sluice.client.producer import FutureRecordMetadata, FutureRecordsMetadata, ProducerConfig, RecordMetadata
from sluice.client.producer import Producer as SyncProducer
from sluice.client.producer.futures import BatchResult
from sluice.codec.batch import Headers
from sluice.errors import SluiceError

__all__ = ["Producer"]


class Producer:
    """Sends records to one topic, for asyncio. Made by ``sluice.aio.Client.producer``."""

    def __init__(self, sync: SyncProducer, bridge: LoopBridge) -> None:
        self._sync = sync
        self._bridge = bridge
        #: The asyncio futures of records whose batch has no outcome yet (touched on the loop's thread only).
        self._waiting: dict[
            BatchResult, list[tuple[asyncio.Future[RecordMetadata], FutureRecordMetadata]]
        ] = {}

    @property
    def sync(self) -> SyncProducer:
        return self._sync

    @property
    def topic(self) -> str:
        return self._sync.topic

    @property
    def config(self) -> ProducerConfig:
        return self._sync.config

    @property
    def partitions(self) -> int:
        return self._sync.partitions

    @property
    def closed(self) -> bool:
        return self._sync.closed

    def in_flight(self, partition: int) -> int:
        """Batches of ``partition`` sent and not answered yet (the sync ``in_flight()``: memory only)."""
        return self._sync.in_flight(partition)

    async def send(
        self,
        value: Any,
        key: Any = None,
        tag: str | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        deliver_at: datetime | None = None,
        deliver_after: timedelta | None = None,
    ) -> RecordMetadata:
        """Send one record and wait for its acknowledgement; the arguments and errors are the sync
        ``send()``'s. Cancelling the wait does not take the record back (it is queued already)."""
        fut = await self.enqueue(
            value, key, tag, headers, partition, timestamp, deliver_at=deliver_at, deliver_after=deliver_after
        )
        return await fut

    async def enqueue(
        self,
        value: Any,
        key: Any = None,
        tag: str | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        *,
        deliver_at: datetime | None = None,
        deliver_after: timedelta | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record and return the future of its metadata without waiting for the broker
        (aiokafka's ``send``): batches fill up while the caller goes on."""
        sync = self._sync
        if deliver_at is None and deliver_after is None and not sync.may_block():
            # By keyword: the sync send()'s parameters may grow (serializers, compression) in any order.
            done = sync.send(
                value, key=key, tag=tag, headers=headers, partition=partition, timestamp=timestamp
            )
        else:
            send = functools.partial(
                sync.send,
                value,
                key=key,
                tag=tag,
                headers=headers,
                partition=partition,
                timestamp=timestamp,
                deliver_at=deliver_at,
                deliver_after=deliver_after,
            )
            done = await self._bridge.loop.run_in_executor(None, send)
        return self._future_of(done)

    async def send_many(
        self,
        values: Sequence[Any],
        keys: Sequence[Any] | None = None,
        *,
        headers: Sequence[Headers | None] | None = None,
        tags: Sequence[str | None] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> list[RecordMetadata]:
        """Send many records in one call and wait for their acknowledgements: the sync ``send_many()``'s
        arguments and errors; returns each record's metadata in the order given."""
        fut = await self.enqueue_many(
            values, keys, headers=headers, tags=tags, partition=partition, timestamp=timestamp
        )
        return await fut

    async def enqueue_many(
        self,
        values: Sequence[Any],
        keys: Sequence[Any] | None = None,
        *,
        headers: Sequence[Headers | None] | None = None,
        tags: Sequence[str | None] | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> asyncio.Future[list[RecordMetadata]]:
        """Queue many records (the sync ``send_many()``) and return one future of their metadata, in
        the order given, without waiting for the broker."""
        sync = self._sync
        send = functools.partial(
            sync.send_many, values, keys, headers=headers, tags=tags, partition=partition, timestamp=timestamp
        )
        sent = send() if not sync.may_block() else await self._bridge.loop.run_in_executor(None, send)
        fut: asyncio.Future[list[RecordMetadata]] = self._bridge.loop.create_future()
        # One loop wake-up once the call's last batch has its outcome (the sender thread posts it).
        sent.add_done_callback(lambda _sent: self._bridge.post(functools.partial(_settle_many, fut, sent)))
        return fut

    def _future_of(self, sent: FutureRecordMetadata) -> asyncio.Future[RecordMetadata]:
        fut: asyncio.Future[RecordMetadata] = self._bridge.loop.create_future()
        if sent.done():
            _settle(fut, sent)
            return fut
        # One completion callback per batch, not per record: a per-record callback from the sender
        # thread cost ~25 us a record (measured, docs/asyncio.md "Costs"); the loop settles the
        # batch's futures in one go.
        batch = sent.batch
        waiting = self._waiting.get(batch)
        if waiting is None:
            waiting = self._waiting[batch] = []
            batch.add_callback(
                functools.partial(self._bridge.post, functools.partial(self._settle_batch, batch))
            )
        waiting.append((fut, sent))
        return fut

    def _settle_batch(self, batch: BatchResult) -> None:
        """On the loop's thread, once ``batch`` has its outcome: settle its records' futures."""
        for fut, sent in self._waiting.pop(batch, ()):
            _settle(fut, sent)

    async def flush(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """The sync ``flush()`` (send everything buffered, wait for every outcome), in a worker thread."""
        await self._bridge.loop.run_in_executor(None, self._sync.flush, timeout)

    def flush_nowait(self) -> None:
        """The sync ``flush_nowait()``: the open batches go to the sender thread; nothing waits, so it
        needs no worker thread (it takes the producer's lock for a moment, as ``send()`` does)."""
        self._sync.flush_nowait()

    async def close(self, timeout: float | None = None) -> None:  # noqa: ASYNC109
        """The sync ``close()`` (deliver what is buffered, stop the sender), in a worker thread."""
        if not self._sync.closed:
            await self._bridge.loop.run_in_executor(None, self._sync.close, timeout)

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<aio {self._sync!r}>"


def _settle(fut: asyncio.Future[RecordMetadata], sent: FutureRecordMetadata) -> None:
    """On the loop's thread: copy a finished send's outcome into its asyncio future."""
    if fut.done():
        return
    try:
        fut.set_result(sent.result(0))
    except SluiceError as exc:
        fut.set_exception(exc)


def _settle_many(fut: asyncio.Future[list[RecordMetadata]], sent: FutureRecordsMetadata) -> None:
    """On the loop's thread: copy a finished ``send_many``'s outcome into its asyncio future."""
    if fut.done():
        return
    try:
        fut.set_result(sent.result(0))
    except SluiceError as exc:
        fut.set_exception(exc)
