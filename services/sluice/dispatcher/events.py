"""The adapters' side of a consumer's stream: core events encoded as ``DispatcherEvent`` protobuf.

:class:`EventStream` is the :class:`~sluice.dispatcher.runtime.ConsumerStream` both transports use:
what the core sends is encoded here and goes to ``sink`` at once: the wire protocol writes each
event itself; gRPC's sink is the queue its response generator drains (the servicer owns it, so a
wire consumer carries no queue: ``docs/dispatcher.md``, "What a consumer costs"). ``None`` marks
the end of the stream. Message batches arrive already serialized (``messages.encode_batch_event``: a
message's bytes are encoded once, when it is read, not once per consumer) and pass through as bytes.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.dispatcher.messages import encode_batch_event, encode_batches_event
from sluice.dispatcher.model import Delivery
from sluice.dispatcher.runtime import ConsumerStream
from sluice.errors import SluiceError
from sluice.v1 import dispatcher_pb2 as pb

__all__ = ["EventStream", "Outgoing"]

Outgoing = bytes | pb.DispatcherEvent | None


class EventStream(ConsumerStream):
    def __init__(self, peer: str, sink: Callable[[Outgoing], None]) -> None:
        super().__init__(peer)
        self._put = sink

    def send(self, item: bytes | pb.DispatcherEvent) -> None:
        if not self.closed:
            self._put(item)

    def subscribed(self, consumer_id: str) -> None:
        self.send(
            pb.DispatcherEvent(
                subscribed=pb.Subscribed(consumer_id=consumer_id, record_batches=self.record_batches)
            )
        )

    def deliver(self, topic: str, delivery: Delivery) -> int:
        messages, counts = delivery.messages, delivery.counts
        if self.record_batches:
            payload = encode_batches_event(topic, messages, counts)
        elif any(counts):
            payload = encode_batch_event(topic, [m.framed(n) for m, n in zip(messages, counts, strict=True)])
        else:
            payload = encode_batch_event(topic, [m.wire for m in messages])
        self.send(payload)
        return len(payload)

    def active_change(self, partition: int, active: bool) -> None:
        self.send(
            pb.DispatcherEvent(active_change=pb.ActiveConsumerChange(partition=partition, is_active=active))
        )

    def error(self, err: SluiceError) -> None:
        self.send(pb.DispatcherEvent(error=err.to_proto()))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._put(None)
