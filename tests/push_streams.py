"""Many push consumers from one asyncio process, straight on the dispatcher's protocol.

For measuring what consumers cost the dispatcher (``bench/push_consumers_memory.py`` and its smoke
test): 1,000 SDK push consumers would be 2,000 threads here, so each consumer is one coroutine that
sends what the SDK's push consumer sends -- ``Subscribe`` (record batches, durable, from the
earliest offset), ``Flow`` with its receiver queue, an ``Ack`` by ranges for every batch -- over a
gRPC ``Consume`` stream (all on one channel, as one ``Client`` opens them) or a wire connection of
its own (as the SDK does). The dispatcher sees the same streams as from the SDK.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from grpc import aio

from sluice.codec.batch import batch_views
from sluice.common.wire import HEADER, FrameReader, FrameType, split_address
from sluice.v1 import dispatcher_pb2 as pb
from sluice.v1 import dispatcher_pb2_grpc, wire_pb2

__all__ = ["PERMITS", "PushStreams"]

#: Each consumer's receiver queue (the SDK's default).
PERMITS = 1000
#: Bounds every wait (seconds).
STEP_TIMEOUT = 120.0


def subscribe(topic: str, subscription: str, consumer: int) -> pb.ConsumerCommand:
    return pb.ConsumerCommand(
        subscribe=pb.Subscribe(
            topic=topic,
            subscription=subscription,
            type=pb.SUBSCRIPTION_TYPE_SHARED,
            consumer_name=f"c{consumer}",
            consumer_id=f"streams-{os.getpid()}-{consumer}",
            initial_position=pb.INITIAL_POSITION_EARLIEST,
            durable=True,
            record_batches=True,
        )
    )


FLOW = pb.ConsumerCommand(flow=pb.Flow(permits=PERMITS))


def ack_all(batch: pb.MessageBatch) -> tuple[int, pb.ConsumerCommand | None]:
    """How many records a MessageBatch holds, and the ack of all of them (by ranges, as the SDK acks)."""
    count = 0
    ranges = []
    for entry in batch.batches:
        bounds: list[int] = []
        for view in batch_views(entry.records):
            for offset in view.offsets:
                bounds += [offset, offset + 1]
        count += len(bounds) // 2
        if bounds:
            ranges.append(pb.OffsetRanges(partition=entry.partition, bounds=bounds))
    return count, pb.ConsumerCommand(ack=pb.Ack(ranges=ranges)) if ranges else None


class PushStreams:
    """Consumers of ``topic`` on one transport (``grpc`` or ``wire``). Use inside a running loop;
    ``close()`` ends them all."""

    def __init__(self, transport: str, topic: str, grpc_address: str, wire_address: str) -> None:
        if transport not in ("grpc", "wire"):
            raise ValueError(f"transport must be grpc or wire, got {transport!r}")
        self.transport = transport
        self.topic = topic
        self.grpc_address = grpc_address
        self.wire_address = wire_address
        #: Records delivered (and acked) so far, over all consumers.
        self.received = 0
        self.subscribed = 0
        #: The first failure of any consumer (a lost connection; an Error event unless collected).
        self.failure: BaseException | None = None
        #: With ``collect_errors``: the messages of the Error events received, in order.
        self.errors: list[str] = []
        self.collect_errors = False
        self._errors_target = 0
        self._errors_enough = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._channel: aio.Channel | None = None
        self._wanted = 0
        self._ready = asyncio.Event()
        self._received_target = 0
        self._received_enough = asyncio.Event()
        #: wire only: each consumer's connection, for ``send_raw``.
        self._writers: dict[int, asyncio.StreamWriter] = {}

    async def open(self, subscriptions: list[str]) -> None:
        """One more consumer per entry of ``subscriptions``; returns once all are subscribed."""
        if self.transport == "grpc" and self._channel is None:
            self._channel = aio.insecure_channel(self.grpc_address)
            # Connected before the first stream: on a loaded machine the connection may take longer
            # than gRPC's own connect timeout, which would fail the streams instead of delaying them.
            await asyncio.wait_for(self._channel.channel_ready(), STEP_TIMEOUT)
        self._wanted += len(subscriptions)
        self._ready.clear()
        first = len(self._tasks)
        run = self._grpc if self.transport == "grpc" else self._wire
        for i, sub in enumerate(subscriptions):
            self._tasks.append(asyncio.create_task(self._guard(run(sub, first + i))))
        await self._wait(self._ready, "subscribed")

    async def wait_received(self, total: int) -> None:
        """Until ``total`` records were delivered (over all consumers)."""
        self._received_target = total
        self._received_enough.clear()
        self._counted(0)
        await self._wait(self._received_enough, f"{total} records received")

    async def wait_errors(self, total: int) -> None:
        """Until ``total`` Error events were collected (``collect_errors``)."""
        self._errors_target = total
        self._errors_enough.clear()
        if len(self.errors) >= total:
            self._errors_enough.set()
        await self._wait(self._errors_enough, f"{total} errors received")

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._channel is not None:
            await self._channel.close(None)

    def send_raw(self, consumer: int, payload: bytes) -> None:
        """wire only: a consume frame with ``payload`` as it is, on the connection of the consumer
        opened ``consumer``-th (from 0)."""
        self._writers[consumer].write(HEADER.pack(len(payload) + 1, FrameType.CONSUME) + payload)

    # ---- the consumers --------------------------------------------------------------------------

    async def _wait(self, event: asyncio.Event, what: str) -> None:
        waiter = asyncio.create_task(event.wait())
        try:
            await asyncio.wait_for(waiter, STEP_TIMEOUT)
        except TimeoutError:
            raise TimeoutError(f"not {what} within {STEP_TIMEOUT} s (failure: {self.failure!r})") from None
        if self.failure is not None:
            raise RuntimeError(f"a consumer failed: {self.failure!r}")

    async def _guard(self, run: Any) -> None:
        try:
            await run
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self.failure is None:
                self.failure = exc
            for waiting in (self._ready, self._received_enough, self._errors_enough):
                waiting.set()  # wake a waiter: it reports the failure

    def _subscribed(self) -> None:
        self.subscribed += 1
        if self.subscribed >= self._wanted:
            self._ready.set()

    def _counted(self, n: int) -> None:
        self.received += n
        if self._received_target and self.received >= self._received_target:
            self._received_enough.set()

    def _event(self, event: pb.DispatcherEvent, n: int) -> pb.ConsumerCommand | None:
        kind = event.WhichOneof("event")
        if kind == "subscribed":
            self._subscribed()
        elif kind == "messages":
            count, ack = ack_all(event.messages)
            self._counted(count)
            return ack
        elif kind == "error":
            if not self.collect_errors:
                raise RuntimeError(f"consumer {n}: {event.error.message}")
            self.errors.append(event.error.message)
            if self._errors_target and len(self.errors) >= self._errors_target:
                self._errors_enough.set()
        return None

    async def _grpc(self, subscription: str, n: int) -> None:
        # A call written to and read from (no request iterator): the stubs' types know only the other
        # form. wait_for_ready: a stream waits out a reconnect rather than fail.
        assert self._channel is not None  # open() made it
        stub: Any = dispatcher_pb2_grpc.DispatcherStub(self._channel)
        call = stub.Consume(wait_for_ready=True, timeout=None)
        await call.write(subscribe(self.topic, subscription, n))
        await call.write(FLOW)
        while isinstance(event := await call.read(), pb.DispatcherEvent):
            ack = self._event(event, n)
            if ack is not None:
                await call.write(ack)
        raise RuntimeError(f"consumer {n}: the dispatcher ended the stream")

    async def _wire(self, subscription: str, n: int) -> None:
        reader, writer = await asyncio.open_connection(*split_address(self.wire_address))
        self._writers[n] = writer

        def send(kind: int, payload: bytes) -> None:
            writer.write(HEADER.pack(len(payload) + 1, kind) + payload)

        send(FrameType.HELLO, wire_pb2.WireHello(version=1, client_id=f"c{n}").SerializeToString())
        send(FrameType.CONSUME, subscribe(self.topic, subscription, n).SerializeToString())
        send(FrameType.CONSUME, FLOW.SerializeToString())
        frames = FrameReader()
        try:
            while data := await reader.read(1 << 16):
                for kind, payload in frames.feed(data):
                    if kind == FrameType.ERROR:
                        raise RuntimeError(f"consumer {n}: an error frame")
                    if kind == FrameType.CONSUME:
                        ack = self._event(pb.DispatcherEvent.FromString(payload), n)
                        if ack is not None:
                            send(FrameType.CONSUME, ack.SerializeToString())
        finally:
            writer.close()
        raise RuntimeError(f"consumer {n}: the dispatcher closed the connection")
