"""Domain values of the cluster state machine: what handlers take and return (no protobuf here)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from sluice.coordinator.cluster.replication import UNREPLICATED, PartitionState, ReplicationConfig
from sluice.errors import InvalidArgument, InvalidRequest, SluiceError

MAX_INCARNATION_LENGTH = 256


@dataclass(frozen=True, order=True)
class Endpoint:
    """A host:port that other processes can reach."""

    host: str
    port: int
    #: A broker's wire-protocol port on the same host; 0 when it serves none.
    wire_port: int = 0

    def validate(self, what: str) -> Endpoint:
        if not self.host or len(self.host) > 255 or any(c.isspace() for c in self.host):
            raise InvalidRequest(f"{what}: endpoint host {self.host!r} is empty or invalid")
        if not 1 <= self.port <= 65535:
            raise InvalidRequest(f"{what}: endpoint port {self.port} is outside 1-65535")
        if not 0 <= self.wire_port <= 65535:
            raise InvalidRequest(f"{what}: wire port {self.wire_port} is outside 1-65535 (0: none)")
        return self

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        """``host:port`` (IPv6 as ``[::1]:7600``) -> Endpoint."""
        host, sep, port = text.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise InvalidArgument(f"invalid address {text!r}: use host:port")
        return cls(host.strip("[]"), int(port)).validate("address")

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class TopicConfig:
    """Per-topic log settings. 0 means "the broker's default" for every field."""

    retention_ms: int = 0
    retention_bytes: int = 0
    segment_bytes: int = 0
    segment_ms: int = 0
    max_batch_bytes: int = 0

    def validate(self) -> TopicConfig:
        for f in fields(self):
            value = getattr(self, f.name)
            if value < 0:
                raise InvalidArgument(f"topic config {f.name}={value} is negative (0 = the broker default)")
        return self

    def to_dict(self) -> dict[str, int]:
        # Only non-defaults: keeps records small and lets new fields default to 0 on old records.
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TopicConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: int(v) for k, v in data.items() if k in known})


def validate_incarnation(incarnation: str, what: str) -> str:
    if not incarnation or len(incarnation) > MAX_INCARNATION_LENGTH:
        raise InvalidRequest(f"{what}: incarnation must be 1-{MAX_INCARNATION_LENGTH} characters")
    return incarnation


# ---- Broker partition updates ------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class PartitionRef:
    """One partition as a broker needs it: which topic incarnation (topic_id), its log settings, and its
    replica state (leader, epochs, replicas, ISR: the broker's role). Compared by identity only, so a
    removal matches the partition whatever its state was."""

    topic: str
    partition: int
    topic_id: str
    config: TopicConfig = field(compare=False)
    #: None only in removals built without a record (the broker needs no role to delete).
    state: PartitionState | None = field(default=None, compare=False)
    min_insync_replicas: int = field(default=1, compare=False)


@dataclass(frozen=True)
class BrokerUpdate:
    """An ``UpdatePartitionsRequest`` for one broker. ``full``: ``assign`` is its whole assignment."""

    metadata_version: int
    full: bool
    assign: tuple[PartitionRef, ...] = ()
    remove: tuple[PartitionRef, ...] = ()


@dataclass(frozen=True)
class MetadataChange:
    """One metadata_version step (base_version -> version) and how it changes each broker's partitions.

    Brokers absent from ``assign``/``remove`` are unaffected but still learn the new version (an empty
    delta), which keeps every broker's sequence of deltas contiguous; see ``docs/coordinator.md``.
    """

    base_version: int
    version: int
    assign: Mapping[int, tuple[PartitionRef, ...]] = field(default_factory=dict)
    remove: Mapping[int, tuple[PartitionRef, ...]] = field(default_factory=dict)

    @property
    def affected(self) -> frozenset[int]:
        return frozenset(self.assign) | frozenset(self.remove)

    def delta_for(self, broker_id: int) -> BrokerUpdate:
        return BrokerUpdate(
            self.version, False, self.assign.get(broker_id, ()), self.remove.get(broker_id, ())
        )


# ---- Views (what reads return) ---------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionView:
    partition: int
    #: The leader (-1: offline). Clients route here.
    broker_id: int
    #: The live dispatcher that serves push subscriptions of this partition; "" when none is alive.
    dispatcher_id: str
    #: Replicas, ISR, ELR and epochs; a one-replica state of ``broker_id`` when not given.
    state: PartitionState | None = None

    @property
    def replica_state(self) -> PartitionState:
        return self.state if self.state is not None else PartitionState.new((self.broker_id,))


@dataclass(frozen=True)
class TopicView:
    name: str
    topic_id: str
    partitions: tuple[PartitionView, ...]
    config: TopicConfig
    created_ms: int
    replication: ReplicationConfig = UNREPLICATED


@dataclass(frozen=True)
class BrokerView:
    broker_id: int
    endpoint: Endpoint
    alive: bool
    rack: str = ""


@dataclass(frozen=True)
class DispatcherView:
    dispatcher_id: str
    endpoint: Endpoint
    alive: bool


@dataclass(frozen=True)
class MetadataView:
    brokers: tuple[BrokerView, ...]
    dispatchers: tuple[DispatcherView, ...]
    topics: tuple[TopicView, ...]
    unknown_topics: tuple[str, ...]
    metadata_version: int


# ---- Handler responses ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """RegisterBroker / RegisterDispatcher answer.

    ``new_incarnation`` is true when this registration started a new epoch (a restarted process), so the
    service layer resets what it knows about that process; ``change`` is set when metadata_version moved.
    """

    epoch: int
    heartbeat_interval_ms: int
    session_timeout_ms: int
    new_incarnation: bool
    change: MetadataChange | None = None


@dataclass(frozen=True)
class BrokerHeartbeatResult:
    #: Sent in the response's ``error`` field (the broker then registers again); nothing else is set.
    error: SluiceError | None = None
    #: A full assignment, present whenever the broker's metadata_version differs from ours.
    update: BrokerUpdate | None = None
    #: Set when the heartbeat moved metadata_version (a broker ahead of us: see ``broker_heartbeat``).
    change: MetadataChange | None = None


@dataclass(frozen=True)
class CreateTopicResult:
    topic: TopicView
    change: MetadataChange


@dataclass(frozen=True)
class DeleteTopicResult:
    name: str
    change: MetadataChange
