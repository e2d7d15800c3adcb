"""Resolving ``earliest`` / ``latest`` / a timestamp to offsets, for ResetOffsets.

The offset store resolves them itself (rather than making every client do it)
so that one ResetOffsets call resets all partitions of a topic atomically,
under one "group is empty" check, and so that ``partitions`` empty can mean
"every partition of the topic". It asks the coordinator's ``Metadata`` for the
topic's partitions and their brokers, then each broker's ``ListOffsets`` (one
call per broker, concurrently). Without a configured coordinator only explicit
offsets can be set; see docs/offset-store.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc
from grpc import aio

from sluice.common.rpc import CHANNEL_OPTIONS, error_from_rpc
from sluice.errors import BrokerNotAvailable, UnknownTopicOrPartition, raise_for_proto
from sluice.offsetstore.model import ResetSpec
from sluice.v1 import broker_pb2, broker_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc

# ListOffsets' sentinel timestamps (broker.proto).
EARLIEST = -2
LATEST = -1


def list_offsets_timestamp(spec: ResetSpec, value: int) -> int:
    """The ``ListOffsetsPartition.timestamp`` that asks a broker for ``spec``."""
    if spec is ResetSpec.EARLIEST:
        return EARLIEST
    if spec is ResetSpec.LATEST:
        return LATEST
    if spec is ResetSpec.TIMESTAMP:
        return value
    raise ValueError(f"{spec} needs no broker")


def topic_partitions(metadata: coordinator_pb2.MetadataResponse, topic: str) -> dict[int, int]:
    """partition -> broker id of ``topic``; UnknownTopicOrPartition if absent."""
    for description in metadata.topics:
        if description.name == topic:
            return {p.partition: p.broker_id for p in description.partitions}
    raise UnknownTopicOrPartition(f"topic {topic!r} does not exist", topic=topic)


def plan_list_offsets(
    metadata: coordinator_pb2.MetadataResponse,
    topic: str,
    partitions: Sequence[int],
    timestamp: int,
) -> dict[str, broker_pb2.ListOffsetsRequest]:
    """One ListOffsets request per broker address, covering ``partitions``.

    Raises UnknownTopicOrPartition for a partition the topic does not have and
    BrokerNotAvailable for one whose broker is unknown or down.
    """
    placement = topic_partitions(metadata, topic)
    brokers = {b.broker_id: b for b in metadata.brokers}
    plan: dict[str, broker_pb2.ListOffsetsRequest] = {}
    for partition in partitions:
        if partition not in placement:
            raise UnknownTopicOrPartition(
                f"topic {topic!r} has no partition {partition} (it has {len(placement)})",
                topic=topic,
                partition=partition,
            )
        broker = brokers.get(placement[partition])
        if broker is None or not broker.alive:
            raise BrokerNotAvailable(
                f"the broker of {topic}/{partition} (id {placement[partition]}) is not available; retry later"
            )
        address = f"{broker.endpoint.host}:{broker.endpoint.port}"
        request = plan.setdefault(address, broker_pb2.ListOffsetsRequest())
        request.partitions.add(topic=topic, partition=partition, timestamp=timestamp)
    return plan


class BrokerOffsetResolver:
    """Looks offsets up through the coordinator's Metadata and brokers' ListOffsets."""

    def __init__(self, coordinator: str, timeout: float = 5.0) -> None:
        self._coordinator = coordinator
        self._timeout = timeout
        self._channels: dict[str, aio.Channel] = {}

    def _channel(self, address: str) -> aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._channels[address] = channel
        return channel

    async def _metadata(self, topic: str) -> coordinator_pb2.MetadataResponse:
        stub = coordinator_pb2_grpc.CoordinatorStub(self._channel(self._coordinator))
        try:
            return await stub.Metadata(coordinator_pb2.MetadataRequest(topics=[topic]), timeout=self._timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    async def partitions(self, topic: str) -> list[int]:
        """Every partition of ``topic``, sorted."""
        return sorted(topic_partitions(await self._metadata(topic), topic))

    async def resolve(
        self, topic: str, partitions: Sequence[int], spec: ResetSpec, value: int
    ) -> dict[int, int]:
        """partition -> offset that ``spec`` (and ``value``) designates now."""
        plan = plan_list_offsets(
            await self._metadata(topic), topic, partitions, list_offsets_timestamp(spec, value)
        )
        replies = await asyncio.gather(*(self._list_offsets(a, r) for a, r in plan.items()))
        resolved: dict[int, int] = {}
        for reply in replies:
            for item in reply.partitions:
                raise_for_proto(item.error if item.HasField("error") else None)
                resolved[item.partition] = item.offset
        missing = set(partitions) - set(resolved)
        if missing:
            raise BrokerNotAvailable(f"brokers did not answer for partitions {sorted(missing)} of {topic!r}")
        return resolved

    async def _list_offsets(
        self, address: str, request: broker_pb2.ListOffsetsRequest
    ) -> broker_pb2.ListOffsetsResponse:
        stub = broker_pb2_grpc.BrokerStub(self._channel(address))
        try:
            return await stub.ListOffsets(request, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()
