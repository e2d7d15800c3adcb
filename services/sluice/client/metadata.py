"""Cluster metadata as the SDK sees it: brokers, topics and where each partition lives.

:class:`ClusterMetadata` is an immutable snapshot; :class:`MetadataCache` keeps the
latest one and replaces it (never edits it) when a caller asks for a refresh,
which producers and fetchers do after NOT_LEADER, UNKNOWN_TOPIC_OR_PARTITION or an
unreachable broker.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.client.rpc import call
from sluice.common.backoff import Backoff
from sluice.common.peers import Peers
from sluice.errors import (
    AuthorizationError,
    BrokerNotAvailable,
    NotCoordinator,
    RequestTimedOut,
    SluiceError,
    UnknownTopicOrPartition,
)
from sluice.v1 import broker_pb2, coordinator_pb2, coordinator_pb2_grpc

__all__ = [
    "TOPIC_CONFIG_KEYS",
    "BrokerInfo",
    "ClusterMetadata",
    "MetadataCache",
    "PartitionInfo",
    "TopicInfo",
]

#: The per-topic settings a TopicInfo.config carries (0 means the broker default).
TOPIC_CONFIG_KEYS = ("retention_ms", "retention_bytes", "segment_bytes", "segment_ms", "max_batch_bytes")


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition: int
    #: The leader: produce and fetch go here (-1: offline, no leader).
    broker_id: int
    dispatcher_id: str = ""
    #: Replicas in preference order (the first is the preferred leader), in-sync replicas, eligible
    #: leader replicas (KIP-966) and epochs. A coordinator older than replication sends none: then the
    #: partition has one replica, ``broker_id``.
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    leader_epoch: int = 0
    partition_epoch: int = 0
    elr: tuple[int, ...] = ()
    #: A reassignment in progress: replicas being added (catching up) and replicas leaving after.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()
    throttle_bytes_per_second: int = 0

    @classmethod
    def from_proto(cls, p: coordinator_pb2.PartitionDescription) -> PartitionInfo:
        replicas = tuple(p.replicas) or (p.broker_id,)
        return cls(
            p.partition,
            p.broker_id,
            p.dispatcher_id,
            replicas,
            tuple(p.isr) or replicas,
            p.leader_epoch,
            p.partition_epoch,
            tuple(p.elr),
            tuple(p.adding_replicas),
            tuple(p.removing_replicas),
            p.throttle_bytes_per_second,
        )


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: str
    partitions: list[PartitionInfo]
    config: dict[str, int] = field(default_factory=dict)
    created_ms: int = 0
    replication_factor: int = 1
    min_insync_replicas: int = 1
    unclean_leader_election: bool = False
    #: Set by create_topic/add_partitions: hosting brokers that did not acknowledge the change in time
    #: (BrokerNotAvailable each). The topic is recorded; their heartbeats bring it to them.
    unacknowledged: tuple[SluiceError, ...] = field(default=(), compare=False)

    @classmethod
    def from_proto(cls, t: coordinator_pb2.TopicDescription) -> TopicInfo:
        return cls(
            name=t.name,
            topic_id=t.topic_id,
            partitions=sorted((PartitionInfo.from_proto(p) for p in t.partitions), key=lambda p: p.partition),
            config=topic_config_from_proto(t.config),
            created_ms=t.created_ms,
            replication_factor=t.replication_factor or 1,
            min_insync_replicas=t.min_insync_replicas or 1,
            unclean_leader_election=t.unclean_leader_election,
        )


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    broker_id: int
    host: str
    port: int
    alive: bool = True
    #: The wire-protocol port on ``host`` (0: the broker serves none).
    wire_port: int = 0
    #: The broker's rack or zone ("" when unknown).
    rack: str = ""

    @property
    def address(self) -> str:
        """The gRPC address: identifies the broker within the SDK."""
        return _join(self.host, self.port)

    @property
    def wire_address(self) -> str | None:
        return _join(self.host, self.wire_port) if self.wire_port else None


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class DispatcherInfo:
    dispatcher_id: str
    host: str
    port: int
    alive: bool = True
    #: The wire-protocol port on ``host`` (0: the dispatcher serves none).
    wire_port: int = 0

    @property
    def address(self) -> str:
        return _join(self.host, self.port)

    @property
    def wire_address(self) -> str | None:
        return _join(self.host, self.wire_port) if self.wire_port else None


@dataclass(frozen=True)
class ClusterMetadata:
    """One consistent view of the cluster. Replaced, never edited."""

    brokers: Mapping[int, BrokerInfo] = field(default_factory=dict)
    topics: Mapping[str, TopicInfo] = field(default_factory=dict)
    unknown_topics: frozenset[str] = frozenset()
    version: int = 0
    coordinator: str | None = None
    offset_store: str | None = None
    dispatchers: Mapping[str, DispatcherInfo] = field(default_factory=dict)
    #: time.monotonic() when this snapshot was fetched.
    fetched_at: float = 0.0

    def topic(self, name: str) -> TopicInfo:
        """The topic's description; raises UnknownTopicOrPartition when it does not exist."""
        t = self.topics.get(name)
        if t is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        return t

    def partition_count(self, topic: str) -> int:
        return len(self.topic(topic).partitions)

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        """The description of ``topic[partition]``, or None if unknown."""
        t = self.topics.get(topic)
        if t is None or not 0 <= partition < len(t.partitions):
            return None
        p = t.partitions[partition]
        if p.partition != partition:  # sparse descriptions: search
            p = next((q for q in t.partitions if q.partition == partition), p)
        return p

    def leader(self, topic: str, partition: int) -> BrokerInfo | None:
        """The live broker hosting ``topic[partition]``, or None if unknown or down."""
        p = self.partition(topic, partition)
        if p is None:
            return None
        b = self.brokers.get(p.broker_id)
        return b if b is not None and b.alive else None

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's leader epoch (KIP-320: fetches carry it), -1 if unknown."""
        p = self.partition(topic, partition)
        return -1 if p is None else p.leader_epoch

    def wire_address(self, address: str) -> str | None:
        """The wire-protocol address of the broker whose gRPC address is ``address``, if any."""
        for b in self.brokers.values():
            if b.address == address:
                return b.wire_address
        return None

    def leader_address(self, topic: str, partition: int) -> str | None:
        b = self.leader(topic, partition)
        return b.address if b is not None else None


def _endpoint(e: coordinator_pb2.Endpoint) -> str | None:
    return f"{e.host}:{e.port}" if e.host and e.port else None


def topic_config_from_proto(c: broker_pb2.TopicConfig) -> dict[str, int]:
    return {k: int(getattr(c, k)) for k in TOPIC_CONFIG_KEYS}


class MetadataCache:
    """The client's latest ClusterMetadata, fetched from the coordinator on demand.

    Caller: Client.metadata, Admin (invalidates after topic changes), producers
    and fetchers (refresh after routing errors). Thread-safe.
    """

    def __init__(self, channels: Peers, bootstrap: str, request_timeout: float) -> None:
        self._channels = channels
        self._bootstrap = bootstrap
        self._timeout = request_timeout
        self._lock = threading.Lock()
        self._current = ClusterMetadata()
        self._complete = False  # True when the snapshot holds every topic

    @property
    def bootstrap(self) -> str:
        return self._bootstrap

    def coordinator_stub(self) -> coordinator_pb2_grpc.CoordinatorStub:
        return self._channels.stub(self._bootstrap, coordinator_pb2_grpc.CoordinatorStub)

    def current(self) -> ClusterMetadata:
        return self._current

    def get(
        self, topics: Iterable[str] | None = None, refresh: bool = False, *, retry: bool = True
    ) -> ClusterMetadata:
        """Metadata covering ``topics`` (None: every topic), from the cache unless ``refresh``.

        ``retry``: keep trying an unreachable coordinator for up to the request timeout
        (callers that have their own backoff loop, like the producer's sender, say False).
        """
        wanted = None if topics is None else sorted(set(topics))
        snap = self._current
        if not refresh:
            if wanted is None and self._complete:
                return snap
            if wanted is not None and all(t in snap.topics for t in wanted):
                return snap
        return self._fetch(wanted, retry)

    def invalidate(self, topic: str | None = None) -> None:
        """Forget a topic (or everything), so the next ``get`` asks the coordinator."""
        with self._lock:
            if topic is None:
                self._current = ClusterMetadata()
            else:
                topics = {k: v for k, v in self._current.topics.items() if k != topic}
                self._current = _replace(self._current, topics=topics)
            self._complete = False

    def _fetch(self, wanted: list[str] | None, retry: bool = True) -> ClusterMetadata:
        request = coordinator_pb2.MetadataRequest(topics=wanted or [])
        if retry:
            resp = call_with_retry(
                lambda: call(self.coordinator_stub().Metadata, request, self._timeout), self._timeout
            )
        else:
            resp = call(self.coordinator_stub().Metadata, request, self._timeout)
        brokers = {
            b.broker_id: BrokerInfo(
                b.broker_id, b.endpoint.host, b.endpoint.port, b.alive, b.endpoint.wire_port, b.rack
            )
            for b in resp.brokers
        }
        dispatchers = {
            d.dispatcher_id: DispatcherInfo(
                d.dispatcher_id, d.endpoint.host, d.endpoint.port, d.alive, d.endpoint.wire_port
            )
            for d in resp.dispatchers
        }
        if resp.unauthorized_topics:
            names = ", ".join(sorted(resp.unauthorized_topics))
            raise AuthorizationError(f"not authorized to describe topic(s) {names}")
        fetched = {t.name: TopicInfo.from_proto(t) for t in resp.topics}
        unknown = frozenset(resp.unknown_topics)
        with self._lock:
            if wanted is None:
                topics = fetched
            else:
                topics = {k: v for k, v in self._current.topics.items() if k not in unknown}
                topics.update(fetched)
            snap = ClusterMetadata(
                brokers=brokers,
                topics=topics,
                unknown_topics=unknown,
                version=resp.metadata_version,
                coordinator=_endpoint(resp.coordinator),
                offset_store=_endpoint(resp.offset_store),
                dispatchers=dispatchers,
                fetched_at=time.monotonic(),
            )
            if snap.version >= self._current.version or wanted is None:
                self._current = snap
                self._complete = wanted is None or self._complete
            return snap


def _replace(m: ClusterMetadata, **changes: Any) -> ClusterMetadata:
    return dataclasses.replace(m, **changes)


_RETRY_ERRORS = (BrokerNotAvailable, NotCoordinator)


def call_with_retry(fn: Any, timeout: float) -> Any:
    """Run an idempotent coordinator call, retrying while it is unreachable, up to ``timeout``.

    A coordinator restart (or a standby taking over) then costs a short wait (the peer layer's
    backoff) instead of an error. Other errors propagate at once.
    """
    deadline = time.monotonic() + timeout
    backoff = Backoff()
    while True:
        try:
            return fn()
        except _RETRY_ERRORS as exc:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RequestTimedOut(f"coordinator unreachable for {timeout:g} s: {exc.message}") from exc
            # A backoff, not a poll: there is no event to wait for while the peer is down.
            time.sleep(min(backoff.next(), remaining))
