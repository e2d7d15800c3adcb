"""Dead letters: messages past ``max_redeliver`` go to ``<topic>.<subscription>.DLQ``, then are acked.

The DLQ topic is created through the coordinator when missing (one partition). Messages keep their
key, tag, headers, value and timestamp, and are produced in one batch per call with ``acks=1``; the
subscription acknowledges them only after the broker confirmed the append, so a crash in between
produces them again (at least once) rather than losing them.

Each dead letter also carries where it came from (``sluice-retry-topic``, ``-partition``, ``-offset``,
unless it has them already: a redriven record keeps its first origin), so ``sluice dlq redrive
--subscription S --to original`` knows its partition. The subscription ``S`` of its redrive topic
``<topic>.S.REDRIVE`` dead-letters to ``<topic>.S.DLQ``, the DLQ it was redriven from, so a record
failing again comes back to the same DLQ and its redrive cap counts there (docs/retry.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from sluice.codec.batch import BatchBuilder
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc
from sluice.dispatcher.cluster import CoordinatorLink
from sluice.dispatcher.messages import Message
from sluice.errors import raise_for_proto
from sluice.retry.levels import H_OFFSET, H_PARTITION, H_SOURCE, H_TOPIC, source_key, sub_dlq_topic
from sluice.v1 import broker_pb2

__all__ = ["DeadLetterSink", "dlq_topic"]

RPC_TIMEOUT = 10.0


dlq_topic = sub_dlq_topic


class DeadLetterSink:
    def __init__(self, link: CoordinatorLink, channels: AioPeers) -> None:
        self._link = link
        self._channels = channels

    async def publish(self, topic: str, subscription: str, messages: Sequence[Message]) -> int:
        """Append ``messages`` to the DLQ topic; returns its end after them; raises the typed error if
        that fails. Each carries its source (``sluice-retry-source``: its coordinates in ``topic``),
        by which a restart finds the parked ones already there (``parkstore.py``)."""
        name = dlq_topic(topic, subscription)
        desc = await self._link.ensure_topic(name)
        builder = BatchBuilder()
        for m in messages:
            r = m.record
            headers = dict(r.headers) if r.headers else {}
            if H_TOPIC not in headers:
                headers[H_TOPIC] = topic.encode()
                headers[H_PARTITION] = str(m.partition).encode()
                headers[H_OFFSET] = str(m.offset).encode()
            headers[H_SOURCE] = source_key(topic, m.partition, m.offset).encode()
            builder.append(r.value, r.key, r.tag, headers, r.timestamp)
        partition = 0
        address = self._link.view.route(name, partition)
        broker = address.broker if address is not None else ""
        if not broker:
            broker = (await self._link.refresh()).route(name, partition).broker  # type: ignore[union-attr]
        stub = self._channels.broker(broker)
        try:
            resp = await stub.Produce(
                broker_pb2.ProduceRequest(
                    acks=1,
                    timeout_ms=int(RPC_TIMEOUT * 1000),
                    partitions=[
                        broker_pb2.ProducePartition(
                            topic=desc.name, partition=partition, records=builder.build()
                        )
                    ],
                ),
                timeout=RPC_TIMEOUT,
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        for part in resp.partitions:
            raise_for_proto(part.error)
        return int(resp.partitions[0].base_offset) + len(messages)
