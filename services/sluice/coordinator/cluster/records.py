"""The cluster state machine's persisted records (version 1), built only through the factories below.

| TYPE         | id             | holds                                                              |
|--------------|----------------|--------------------------------------------------------------------|
| ``cluster``  | ``metadata``   | metadata_version and the last broker / dispatcher epochs handed out |
| ``broker``   | broker id      | endpoint, incarnation and epoch of a registered broker             |
| ``dispatcher`` | dispatcher id | endpoint, incarnation and epoch of a registered dispatcher        |
| ``topic``    | topic name     | topic_id, placement (leader of each partition), config, created_ms, |
|              |                | and for replicated topics (version 2) replication and partitions    |

Liveness is soft state and is never persisted: after a restart every broker is "not heard from yet" until
its next heartbeat (at most one heartbeat interval).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from sluice.coordinator.cluster.model import Endpoint, PartitionRef, TopicConfig
from sluice.coordinator.cluster.replication import UNREPLICATED, PartitionState, ReplicationConfig
from sluice.coordinator.records import RecordValue, Tombstone

__all__ = [
    "BrokerRecord",
    "ClusterRecord",
    "DispatcherRecord",
    "TopicRecord",
    "new_broker_record",
    "new_cluster_record",
    "new_dispatcher_record",
    "new_replicated_topic_record",
    "new_topic_record",
    "new_topic_tombstone",
]


def _endpoint(data: Mapping[str, Any]) -> Endpoint:
    # Records written before brokers had a wire port lack the key: they serve none.
    return Endpoint(str(data["host"]), int(data["port"]), int(data.get("wire_port", 0)))


@dataclass(frozen=True)
class ClusterRecord(RecordValue):
    """Cluster-wide counters. Written with every change that moves one of them."""

    TYPE: ClassVar[str] = "cluster"
    VERSION: ClassVar[int] = 1

    metadata_version: int
    last_broker_epoch: int
    last_dispatcher_epoch: int

    @property
    def record_id(self) -> str:
        return "metadata"

    def to_dict(self) -> dict[str, Any]:
        return {
            "metadata_version": self.metadata_version,
            "last_broker_epoch": self.last_broker_epoch,
            "last_dispatcher_epoch": self.last_dispatcher_epoch,
        }

    @classmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        return cls(
            int(data["metadata_version"]), int(data["last_broker_epoch"]), int(data["last_dispatcher_epoch"])
        )


@dataclass(frozen=True)
class BrokerRecord(RecordValue):
    TYPE: ClassVar[str] = "broker"
    VERSION: ClassVar[int] = 1

    broker_id: int
    endpoint: Endpoint
    incarnation: str
    broker_epoch: int
    registered_ms: int
    #: The broker's rack or zone (``--rack``); "" when unknown (and in records of before racks).
    rack: str = ""

    @property
    def record_id(self) -> str:
        return str(self.broker_id)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "broker_id": self.broker_id,
            "host": self.endpoint.host,
            "port": self.endpoint.port,
            "wire_port": self.endpoint.wire_port,
            "incarnation": self.incarnation,
            "epoch": self.broker_epoch,
            "registered_ms": self.registered_ms,
        }
        if self.rack:
            out["rack"] = self.rack
        return out

    @classmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        return cls(
            int(data["broker_id"]),
            _endpoint(data),
            str(data["incarnation"]),
            int(data["epoch"]),
            int(data["registered_ms"]),
            str(data.get("rack", "")),
        )


@dataclass(frozen=True)
class DispatcherRecord(RecordValue):
    TYPE: ClassVar[str] = "dispatcher"
    VERSION: ClassVar[int] = 1

    dispatcher_id: str
    endpoint: Endpoint
    incarnation: str
    dispatcher_epoch: int
    registered_ms: int

    @property
    def record_id(self) -> str:
        return self.dispatcher_id

    def to_dict(self) -> dict[str, Any]:
        return {
            "dispatcher_id": self.dispatcher_id,
            "host": self.endpoint.host,
            "port": self.endpoint.port,
            "wire_port": self.endpoint.wire_port,
            "incarnation": self.incarnation,
            "epoch": self.dispatcher_epoch,
            "registered_ms": self.registered_ms,
        }

    @classmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        return cls(
            str(data["dispatcher_id"]),
            _endpoint(data),
            str(data["incarnation"]),
            int(data["epoch"]),
            int(data["registered_ms"]),
        )


@dataclass(frozen=True)
class TopicRecord(RecordValue):
    """A topic and its partitions' replica state: ``states[p]`` is partition ``p``'s replicas, leader, ISR
    and epochs (cluster/replication.py); ``placement[p]`` its leader.

    Version 1 (every record of before replication, and every topic still at factor 1 with epoch 0) holds
    only the leaders, as ``placement``; version 2 adds ``replication`` and ``partitions``. A one-replica
    topic is still written as version 1, so an older coordinator reads it as before; a replicated one is
    version 2, which an older coordinator refuses loudly instead of reading it as unreplicated.
    """

    TYPE: ClassVar[str] = "topic"
    VERSION: ClassVar[int] = 2

    name: str
    topic_id: str
    states: tuple[PartitionState, ...]
    config: TopicConfig
    created_ms: int
    replication: ReplicationConfig = UNREPLICATED

    @property
    def record_id(self) -> str:
        return self.name

    @property
    def partitions(self) -> int:
        return len(self.states)

    @property
    def placement(self) -> tuple[int, ...]:
        """The leader of each partition (``NO_LEADER`` when offline): where clients route."""
        return tuple(s.leader for s in self.states)

    def ref(self, partition: int) -> PartitionRef:
        """Partition ``partition`` as its brokers are told it (their role comes from its state)."""
        return PartitionRef(
            self.name,
            partition,
            self.topic_id,
            self.config,
            self.states[partition],
            self.replication.min_insync_replicas,
        )

    def refs_by_broker(self, partitions: Iterable[int] | None = None) -> dict[int, tuple[PartitionRef, ...]]:
        """Every replica's share of ``partitions`` (default: all): each replica hosts the partition, the
        leader as leader and the others as followers."""
        by_broker: dict[int, list[PartitionRef]] = {}
        for p in range(self.partitions) if partitions is None else partitions:
            ref = self.ref(p)
            for b in self.states[p].replicas:
                by_broker.setdefault(b, []).append(ref)
        return {b: tuple(refs) for b, refs in by_broker.items()}

    @property
    def encoding_version(self) -> int:
        return 1 if self._unreplicated else 2

    @property
    def _unreplicated(self) -> bool:
        return self.replication.is_default and all(s.is_single for s in self.states)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "topic_id": self.topic_id,
            "placement": list(self.placement),
            "config": self.config.to_dict(),
            "created_ms": self.created_ms,
        }
        if not self._unreplicated:
            out["replication"] = self.replication.to_dict()
            out["partitions"] = [s.to_dict() for s in self.states]
        return out

    @classmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        if version >= 2 and "partitions" in data:
            states = tuple(PartitionState.from_dict(p) for p in data["partitions"])
        else:
            # Before replication: one replica per partition, the broker that holds it.
            states = tuple(PartitionState.new((int(b),)) for b in data["placement"])
        return cls(
            str(data["name"]),
            str(data["topic_id"]),
            states,
            TopicConfig.from_dict(data.get("config") or {}),
            int(data["created_ms"]),
            ReplicationConfig.from_dict(data.get("replication") or {}),
        )


#: Replay order on recovery follows this order.
CLUSTER_RECORD_TYPES: tuple[type[RecordValue], ...] = (
    ClusterRecord,
    BrokerRecord,
    DispatcherRecord,
    TopicRecord,
)


def new_cluster_record(
    metadata_version: int, last_broker_epoch: int, last_dispatcher_epoch: int
) -> ClusterRecord:
    return ClusterRecord(metadata_version, last_broker_epoch, last_dispatcher_epoch)


def new_broker_record(
    broker_id: int,
    endpoint: Endpoint,
    incarnation: str,
    broker_epoch: int,
    registered_ms: int,
    rack: str = "",
) -> BrokerRecord:
    return BrokerRecord(broker_id, endpoint, incarnation, broker_epoch, registered_ms, rack)


def new_dispatcher_record(
    dispatcher_id: str, endpoint: Endpoint, incarnation: str, dispatcher_epoch: int, registered_ms: int
) -> DispatcherRecord:
    return DispatcherRecord(dispatcher_id, endpoint, incarnation, dispatcher_epoch, registered_ms)


def new_topic_record(
    name: str, topic_id: str, placement: Sequence[int], config: TopicConfig, created_ms: int
) -> TopicRecord:
    """A one-replica topic: ``placement[p]`` holds and leads partition ``p``."""
    return TopicRecord(name, topic_id, tuple(PartitionState.new((b,)) for b in placement), config, created_ms)


def new_replicated_topic_record(
    name: str,
    topic_id: str,
    states: Sequence[PartitionState],
    config: TopicConfig,
    created_ms: int,
    replication: ReplicationConfig,
) -> TopicRecord:
    return TopicRecord(name, topic_id, tuple(states), config, created_ms, replication)


def new_topic_tombstone(name: str) -> Tombstone:
    return Tombstone(TopicRecord.TYPE, name)
