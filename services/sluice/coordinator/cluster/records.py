"""The cluster state machine's persisted records (version 1), built only through the factories below.

| TYPE         | id             | holds                                                              |
|--------------|----------------|--------------------------------------------------------------------|
| ``cluster``  | ``metadata``   | metadata_version and the last broker / dispatcher epochs handed out |
| ``broker``   | broker id      | endpoint, incarnation and epoch of a registered broker             |
| ``dispatcher`` | dispatcher id | endpoint, incarnation and epoch of a registered dispatcher        |
| ``topic``    | topic name     | topic_id, placement (broker of each partition), config, created_ms |

Liveness is soft state and is never persisted: after a restart every broker is "not heard from yet" until
its next heartbeat (at most one heartbeat interval).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from sluice.coordinator.cluster.model import Endpoint, TopicConfig
from sluice.coordinator.records import RecordValue, Tombstone

__all__ = [
    "BrokerRecord",
    "ClusterRecord",
    "DispatcherRecord",
    "TopicRecord",
    "new_broker_record",
    "new_cluster_record",
    "new_dispatcher_record",
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

    @property
    def record_id(self) -> str:
        return str(self.broker_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "broker_id": self.broker_id,
            "host": self.endpoint.host,
            "port": self.endpoint.port,
            "wire_port": self.endpoint.wire_port,
            "incarnation": self.incarnation,
            "epoch": self.broker_epoch,
            "registered_ms": self.registered_ms,
        }

    @classmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        return cls(
            int(data["broker_id"]),
            _endpoint(data),
            str(data["incarnation"]),
            int(data["epoch"]),
            int(data["registered_ms"]),
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
    """A topic and its placement: ``placement[p]`` is the broker id hosting partition ``p``."""

    TYPE: ClassVar[str] = "topic"
    VERSION: ClassVar[int] = 1

    name: str
    topic_id: str
    placement: tuple[int, ...]
    config: TopicConfig
    created_ms: int

    @property
    def record_id(self) -> str:
        return self.name

    @property
    def partitions(self) -> int:
        return len(self.placement)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic_id": self.topic_id,
            "placement": list(self.placement),
            "config": self.config.to_dict(),
            "created_ms": self.created_ms,
        }

    @classmethod
    def from_dict(cls, version: int, data: Mapping[str, Any]) -> Self:
        return cls(
            str(data["name"]),
            str(data["topic_id"]),
            tuple(int(b) for b in data["placement"]),
            TopicConfig.from_dict(data.get("config") or {}),
            int(data["created_ms"]),
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
    broker_id: int, endpoint: Endpoint, incarnation: str, broker_epoch: int, registered_ms: int
) -> BrokerRecord:
    return BrokerRecord(broker_id, endpoint, incarnation, broker_epoch, registered_ms)


def new_dispatcher_record(
    dispatcher_id: str, endpoint: Endpoint, incarnation: str, dispatcher_epoch: int, registered_ms: int
) -> DispatcherRecord:
    return DispatcherRecord(dispatcher_id, endpoint, incarnation, dispatcher_epoch, registered_ms)


def new_topic_record(
    name: str, topic_id: str, placement: Sequence[int], config: TopicConfig, created_ms: int
) -> TopicRecord:
    return TopicRecord(name, topic_id, tuple(placement), config, created_ms)


def new_topic_tombstone(name: str) -> Tombstone:
    return Tombstone(TopicRecord.TYPE, name)
