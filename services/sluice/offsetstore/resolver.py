"""Resolving ``earliest`` / ``latest`` / a timestamp to offsets, for ResetOffsets.

The offset store resolves them itself (rather than making every client do it)
so that one ResetOffsets call resets all partitions of a topic atomically,
under one "group is empty" check, and so that ``partitions`` empty can mean
"every partition of the topic". It asks the coordinator's ``Metadata`` for the
topic's partitions and their brokers, then each broker's ``ListOffsets`` (one
call per broker, concurrently: the peer layer's planner, ``sluice.common.list_offsets``).
Without a configured coordinator only explicit offsets can be set; see docs/offset-store.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import grpc

from sluice.common import list_offsets as planner
from sluice.common.list_offsets import EARLIEST, LATEST
from sluice.common.peers import AioPeers, AioRefreshGate
from sluice.common.rpc import error_from_rpc
from sluice.errors import UnknownTopicOrPartition
from sluice.offsetstore.model import ResetSpec
from sluice.v1 import coordinator_pb2

__all__ = [
    "EARLIEST",
    "LATEST",
    "BrokerOffsetResolver",
    "Placement",
    "list_offsets_timestamp",
    "topic_partitions",
]


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


class Placement:
    """Where ``topic``'s partitions live according to one ``MetadataResponse``: the planner's routing."""

    def __init__(self, metadata: coordinator_pb2.MetadataResponse, topic: str) -> None:
        self.topic = topic
        self.brokers = topic_partitions(metadata, topic)  # partition -> broker id
        self._alive = {
            b.broker_id: f"{b.endpoint.host}:{b.endpoint.port}" for b in metadata.brokers if b.alive
        }

    def check(self, partitions: Sequence[int]) -> None:
        """UnknownTopicOrPartition for a partition the topic does not have: no broker can fix that."""
        for partition in partitions:
            if partition not in self.brokers:
                raise UnknownTopicOrPartition(
                    f"topic {self.topic!r} has no partition {partition} (it has {len(self.brokers)})",
                    topic=self.topic,
                    partition=partition,
                )

    def leader_of(self, topic: str, partition: int) -> str | None:
        """The live broker's address, or None (the planner retries after a refresh, then reports it)."""
        broker = self.brokers.get(partition) if topic == self.topic else None
        return None if broker is None else self._alive.get(broker)


class BrokerOffsetResolver:
    """Looks offsets up through the coordinator's Metadata and the peer layer's ListOffsets planner.

    A broker that is down or no longer leads makes the planner read Metadata again (once per burst, for
    every resolve in flight) and retry, for up to ``timeout`` seconds.
    """

    def __init__(self, coordinator: str, timeout: float = 5.0) -> None:
        self._coordinator = coordinator
        self._timeout = timeout
        self._peers = AioPeers()
        #: The placement of each topic a resolve is in flight for (what the planner routes by).
        self._placements: dict[str, Placement] = {}
        self._in_flight: Counter[str] = Counter()
        self._routing = AioRefreshGate(self._refresh)

    async def _metadata(self, topic: str) -> coordinator_pb2.MetadataResponse:
        stub = self._peers.coordinator(self._coordinator)
        try:
            return await stub.Metadata(coordinator_pb2.MetadataRequest(topics=[topic]), timeout=self._timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None

    async def _placement(self, topic: str) -> Placement:
        placement = self._placements[topic] = Placement(await self._metadata(topic), topic)
        return placement

    async def _refresh(self) -> None:
        for topic in [t for t, n in self._in_flight.items() if n > 0]:
            await self._placement(topic)

    async def partitions(self, topic: str) -> list[int]:
        """Every partition of ``topic``, sorted."""
        return sorted(topic_partitions(await self._metadata(topic), topic))

    async def resolve(
        self, topic: str, partitions: Sequence[int], spec: ResetSpec, value: int
    ) -> dict[int, int]:
        """partition -> offset that ``spec`` (and ``value``) designates now."""
        self._in_flight[topic] += 1
        try:
            (await self._placement(topic)).check(partitions)
            answer = await planner.list_offsets(
                self._peers,
                [(topic, p) for p in partitions],
                list_offsets_timestamp(spec, value),
                self._leader_of,
                bound=planner.RetryBound(self._timeout),
                rpc_timeout=self._timeout,
                gate=self._routing,
            )
        finally:
            self._in_flight[topic] -= 1
            if not self._in_flight[topic]:
                del self._in_flight[topic]
                self._placements.pop(topic, None)
        error = answer.first_error()
        if error is not None:
            raise error
        return {p: answer.offsets[(topic, p)] for p in partitions}

    def _leader_of(self, topic: str, partition: int) -> str | None:
        placement = self._placements.get(topic)
        return None if placement is None else placement.leader_of(topic, partition)

    async def close(self) -> None:
        await self._peers.close()
