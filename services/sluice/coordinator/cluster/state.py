"""The cluster state machine: brokers, dispatchers, topics and placement. Pure: no I/O, no clock.

Handlers (``register_broker``, ``create_topic``, ...) validate, decide, and return a :class:`Result` of a
response plus the records to persist; they never change durable state. The service layer persists the
records atomically and then calls :meth:`ClusterState.replay` for each, which is the only place durable state
changes, and startup recovery replays the same records. Handlers must therefore run one at a time, each
with its records replayed before the next starts (the service layer's write lock).

Soft state (liveness sessions) is touched directly by handlers: it is never persisted and a restart
re-learns it from heartbeats (Kafka's timers work the same way).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sluice.common.names import MAX_PARTITIONS, validate_group, validate_topic
from sluice.coordinator.cluster.capacity import check_capacity, validate_rack
from sluice.coordinator.cluster.model import (
    BrokerHeartbeatResult,
    BrokerUpdate,
    BrokerView,
    CreateTopicResult,
    DeleteTopicResult,
    DispatcherView,
    Endpoint,
    MetadataChange,
    MetadataView,
    PartitionView,
    Registration,
    TopicConfig,
    TopicView,
    validate_incarnation,
)
from sluice.coordinator.cluster.placement import assign_replicas, route_topic
from sluice.coordinator.cluster.records import (
    CLUSTER_RECORD_TYPES,
    BrokerRecord,
    ClusterRecord,
    DispatcherRecord,
    TopicRecord,
    new_broker_record,
    new_cluster_record,
    new_dispatcher_record,
    new_replicated_topic_record,
    new_topic_tombstone,
)
from sluice.coordinator.cluster.replication import DEFAULT_SPEC, PartitionState, ReplicationSpec, altered
from sluice.coordinator.cluster.sessions import Liveness, SessionTracker
from sluice.coordinator.records import Record, RecordValue, Result, Tombstone
from sluice.errors import (
    FencedMemberEpoch,
    InvalidPartitions,
    InvalidRequest,
    TopicAlreadyExists,
    UnknownMember,
    UnknownTopicOrPartition,
)

__all__ = ["ClusterSettings", "ClusterState"]


@dataclass(frozen=True)
class ClusterSettings:
    broker_heartbeat_interval_ms: int = 2_000
    broker_session_timeout_ms: int = 10_000
    dispatcher_heartbeat_interval_ms: int = 2_000
    dispatcher_session_timeout_ms: int = 10_000
    #: Replicas of a topic created without a replication factor (``--default-replication-factor``).
    default_replication_factor: int = 1
    #: Preferred leaders (docs/replication.md): the automatic rebalance's period and per-broker threshold.
    auto_leader_rebalance: bool = True
    leader_imbalance_check_interval_ms: int = 30_000
    leader_imbalance_per_broker_percentage: int = 10


class ClusterState:
    """Durable cluster metadata (rebuilt by replay) plus soft liveness."""

    RECORD_TYPES: tuple[type[RecordValue], ...] = CLUSTER_RECORD_TYPES

    def __init__(
        self,
        settings: ClusterSettings | None = None,
        broker_sessions: SessionTracker[int] | None = None,
        dispatcher_sessions: SessionTracker[str] | None = None,
    ) -> None:
        self.settings = settings or ClusterSettings()
        # Durable (replay only).
        self.metadata_version = 0
        self.last_broker_epoch = 0
        self.last_dispatcher_epoch = 0
        self.brokers: dict[int, BrokerRecord] = {}
        self.dispatchers: dict[str, DispatcherRecord] = {}
        self.topics: dict[str, TopicRecord] = {}
        # Soft. Injectable so a reload of durable state (after an ambiguous write) keeps liveness.
        self.broker_sessions = broker_sessions or SessionTracker[int](self.settings.broker_session_timeout_ms)
        self.dispatcher_sessions = dispatcher_sessions or SessionTracker[str](
            self.settings.dispatcher_session_timeout_ms
        )
        # Derived cache: dispatcher routing per topic for the current set of live dispatchers.
        self._routes_for: tuple[str, ...] = ()
        self._routes: dict[tuple[str, str], tuple[str, ...]] = {}

    # ---- replay: the only mutation of durable state --------------------------------------------------

    def replay(self, record: Record) -> None:
        """Apply one persisted record. Caller: the service layer after a write, and recovery."""
        if isinstance(record, Tombstone):
            if record.type == TopicRecord.TYPE:
                gone = self.topics.pop(record.id, None)
                if gone is not None:
                    self._routes.pop((gone.name, gone.topic_id), None)
                return
            raise ValueError(f"cluster state cannot replay a tombstone of type {record.type!r}")
        if isinstance(record, ClusterRecord):
            self.metadata_version = record.metadata_version
            self.last_broker_epoch = record.last_broker_epoch
            self.last_dispatcher_epoch = record.last_dispatcher_epoch
        elif isinstance(record, BrokerRecord):
            self.brokers[record.broker_id] = record
        elif isinstance(record, DispatcherRecord):
            self.dispatchers[record.dispatcher_id] = record
        elif isinstance(record, TopicRecord):
            self.topics[record.name] = record
        else:
            raise ValueError(f"cluster state cannot replay {type(record).__name__}")

    def _counters(
        self,
        metadata_version: int | None = None,
        broker_epoch: int | None = None,
        dispatcher_epoch: int | None = None,
    ) -> ClusterRecord:
        return new_cluster_record(
            self.metadata_version if metadata_version is None else metadata_version,
            self.last_broker_epoch if broker_epoch is None else broker_epoch,
            self.last_dispatcher_epoch if dispatcher_epoch is None else dispatcher_epoch,
        )

    # ---- brokers -------------------------------------------------------------------------------------

    def register_broker(
        self, broker_id: int, endpoint: Endpoint, incarnation: str, now_ms: int, rack: str = ""
    ) -> Result[Registration]:
        """A broker process (re)starts. Same incarnation and endpoint again: idempotent (a retry, or a
        periodic re-registration), same epoch, nothing persisted. Otherwise a new, higher epoch."""
        if broker_id < 0:
            raise InvalidRequest(f"broker_id must be >= 0, got {broker_id}")
        endpoint.validate(f"broker {broker_id}")
        validate_incarnation(incarnation, f"broker {broker_id}")
        validate_rack(rack, broker_id)
        s = self.settings
        existing = self.brokers.get(broker_id)
        if (
            existing is not None
            and existing.incarnation == incarnation
            and existing.endpoint == endpoint
            and existing.rack == rack
        ):
            self.broker_sessions.touch(broker_id, existing.broker_epoch, now_ms)
            return Result(
                Registration(
                    existing.broker_epoch, s.broker_heartbeat_interval_ms, s.broker_session_timeout_ms, False
                )
            )
        epoch = self.last_broker_epoch + 1
        # A new broker or a moved one changes what Metadata answers; a restart in place does not.
        moved = existing is None or existing.endpoint != endpoint or existing.rack != rack
        version = self.metadata_version + 1 if moved else self.metadata_version
        change = MetadataChange(self.metadata_version, version) if moved else None
        self.broker_sessions.touch(broker_id, epoch, now_ms)
        return Result(
            Registration(epoch, s.broker_heartbeat_interval_ms, s.broker_session_timeout_ms, True, change),
            (
                new_broker_record(broker_id, endpoint, incarnation, epoch, now_ms, rack),
                self._counters(metadata_version=version, broker_epoch=epoch),
            ),
        )

    def broker_heartbeat(
        self, broker_id: int, broker_epoch: int, metadata_version: int, now_ms: int
    ) -> Result[BrokerHeartbeatResult]:
        """A broker's periodic heartbeat: renews its session and reconciles its partitions.

        Whenever the broker's applied ``metadata_version`` differs from ours, the answer carries its full
        assignment. A broker *ahead* of us means our metadata was lost or rolled back (e.g. Redis restored
        from an old backup); we then jump our version past the broker's, because brokers only ever apply
        newer versions (the contract in docs/coordinator.md).
        """
        b = self.brokers.get(broker_id)
        if b is None:
            return Result(
                BrokerHeartbeatResult(
                    UnknownMember(
                        f"broker {broker_id} is not registered with this coordinator: call RegisterBroker"
                    )
                )
            )
        if broker_epoch != b.broker_epoch:
            return Result(
                BrokerHeartbeatResult(
                    FencedMemberEpoch(
                        f"broker {broker_id} epoch {broker_epoch} is not current (current epoch "
                        f"{b.broker_epoch}, incarnation {b.incarnation!r}): call RegisterBroker again"
                    )
                )
            )
        if metadata_version < 0:
            raise InvalidRequest(f"metadata_version must be >= 0, got {metadata_version}")
        self.broker_sessions.touch(broker_id, broker_epoch, now_ms)
        if metadata_version == self.metadata_version:
            return Result(BrokerHeartbeatResult())
        if metadata_version < self.metadata_version:
            return Result(BrokerHeartbeatResult(update=self.broker_assignment(broker_id)))
        version = metadata_version + 1
        return Result(
            BrokerHeartbeatResult(
                update=self.broker_assignment(broker_id, version),
                change=MetadataChange(self.metadata_version, version),
            ),
            (self._counters(metadata_version=version),),
        )

    def broker_assignment(self, broker_id: int, version: int | None = None) -> BrokerUpdate:
        """The broker's complete assignment as a full update at ``version`` (default: the current one):
        every partition it is a replica of."""
        refs = [
            t.ref(p)
            for t in self.topics.values()
            for p, state in enumerate(t.states)
            if broker_id in state.replicas
        ]
        refs.sort()
        return BrokerUpdate(self.metadata_version if version is None else version, True, tuple(refs))

    def broker_liveness(self, broker_id: int, now_ms: int) -> Liveness:
        b = self.brokers.get(broker_id)
        if b is None:
            return Liveness.UNKNOWN
        return self.broker_sessions.state(broker_id, b.broker_epoch, now_ms)

    def live_brokers(self, now_ms: int) -> list[int]:
        return sorted(
            b.broker_id
            for b in self.brokers.values()
            if self.broker_sessions.is_alive(b.broker_id, b.broker_epoch, now_ms)
        )

    # ---- dispatchers ---------------------------------------------------------------------------------

    def register_dispatcher(
        self, dispatcher_id: str, endpoint: Endpoint, incarnation: str, now_ms: int
    ) -> Result[Registration]:
        """Like ``register_broker``. Dispatchers have no heartbeat RPC: calling RegisterDispatcher again
        with the same incarnation every heartbeat interval is the heartbeat (idempotent)."""
        validate_group(dispatcher_id, "dispatcher id")
        endpoint.validate(f"dispatcher {dispatcher_id}")
        validate_incarnation(incarnation, f"dispatcher {dispatcher_id}")
        s = self.settings
        existing = self.dispatchers.get(dispatcher_id)
        if existing is not None and existing.incarnation == incarnation and existing.endpoint == endpoint:
            self.dispatcher_sessions.touch(dispatcher_id, existing.dispatcher_epoch, now_ms)
            return Result(
                Registration(
                    existing.dispatcher_epoch,
                    s.dispatcher_heartbeat_interval_ms,
                    s.dispatcher_session_timeout_ms,
                    False,
                )
            )
        epoch = self.last_dispatcher_epoch + 1
        moved = existing is None or existing.endpoint != endpoint
        version = self.metadata_version + 1 if moved else self.metadata_version
        change = MetadataChange(self.metadata_version, version) if moved else None
        self.dispatcher_sessions.touch(dispatcher_id, epoch, now_ms)
        return Result(
            Registration(
                epoch, s.dispatcher_heartbeat_interval_ms, s.dispatcher_session_timeout_ms, True, change
            ),
            (
                new_dispatcher_record(dispatcher_id, endpoint, incarnation, epoch, now_ms),
                self._counters(metadata_version=version, dispatcher_epoch=epoch),
            ),
        )

    def live_dispatchers(self, now_ms: int) -> list[str]:
        return sorted(
            d.dispatcher_id
            for d in self.dispatchers.values()
            if self.dispatcher_sessions.is_alive(d.dispatcher_id, d.dispatcher_epoch, now_ms)
        )

    # ---- topics --------------------------------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int,
        config: TopicConfig,
        topic_id: str,
        now_ms: int,
        spec: ReplicationSpec = DEFAULT_SPEC,
    ) -> Result[CreateTopicResult]:
        """Place a new topic's partitions and their replicas over the live brokers (``assign_replicas``):
        the preferred replica leads, all are in sync, epochs 0. ``topic_id`` is chosen by the caller
        (random in production) so this stays deterministic."""
        validate_topic(name)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidPartitions(
                f"topic {name!r}: partitions must be between 1 and {MAX_PARTITIONS}, got {partitions}"
            )
        config.validate()
        replication = spec.resolve(self.settings.default_replication_factor, name)
        existing = self.topics.get(name)
        if existing is not None:
            raise TopicAlreadyExists(
                f"topic {name!r} already exists with {existing.partitions} partitions "
                f"(id {existing.topic_id})"
            )
        live = self._live_for(name, replication.factor, now_ms)
        replicas = assign_replicas(name, partitions, live, replication.factor, self._racks())
        record = new_replicated_topic_record(
            name, topic_id, [PartitionState.new(r) for r in replicas], config, now_ms, replication
        )
        version = self.metadata_version + 1
        change = MetadataChange(self.metadata_version, version, assign=record.refs_by_broker())
        return Result(
            CreateTopicResult(self._view(record, self.live_dispatchers(now_ms)), change),
            (record, self._counters(metadata_version=version)),
        )

    def _live_for(self, name: str, factor: int, now_ms: int) -> list[int]:
        """The live brokers, when there are enough for ``factor`` replicas (capacity.py)."""
        live = self.live_brokers(now_ms)
        check_capacity(name, factor, live, self.brokers.values(), self.broker_sessions, now_ms)
        return live

    def _racks(self) -> dict[int, str]:
        return {b.broker_id: b.rack for b in self.brokers.values() if b.rack}

    def add_partitions(self, name: str, partitions: int, now_ms: int) -> Result[CreateTopicResult]:
        """Grow a topic: existing partitions keep their replicas, new ones continue the placement over the
        live brokers, with the topic's replication factor."""
        validate_topic(name)
        record = self.topics.get(name)
        if record is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        if not record.partitions < partitions <= MAX_PARTITIONS:
            raise InvalidPartitions(
                f"topic {name!r} has {record.partitions} partitions: the new count must be larger "
                f"(partitions can be added, never removed) and at most {MAX_PARTITIONS}, got {partitions}"
            )
        factor = record.replication.factor
        live = self._live_for(name, factor, now_ms)
        added = assign_replicas(name, partitions, live, factor, self._racks())[record.partitions :]
        grown = new_replicated_topic_record(
            name,
            record.topic_id,
            (*record.states, *(PartitionState.new(r) for r in added)),
            record.config,
            record.created_ms,
            record.replication,
        )
        version = self.metadata_version + 1
        change = MetadataChange(
            self.metadata_version,
            version,
            assign=grown.refs_by_broker(range(record.partitions, partitions)),
        )
        return Result(
            CreateTopicResult(self._view(grown, self.live_dispatchers(now_ms)), change),
            (grown, self._counters(metadata_version=version)),
        )

    def alter_topic(
        self, name: str, min_insync_replicas: int, unclean_leader_election: bool | None, now_ms: int
    ) -> Result[CreateTopicResult]:
        """Change a topic's replication settings, and tell every replica (at the next version, even when
        nothing changed: a retry after a broker did not apply it pushes it again). The partitions' states
        and epochs stay: these are settings of the topic, not a change of who leads or is in sync."""
        validate_topic(name)
        record = self.topics.get(name)
        if record is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        replication = altered(record.replication, name, min_insync_replicas, unclean_leader_election)
        new = new_replicated_topic_record(
            name, record.topic_id, record.states, record.config, record.created_ms, replication
        )
        version = self.metadata_version + 1
        change = MetadataChange(self.metadata_version, version, assign=new.refs_by_broker())
        return Result(
            CreateTopicResult(self._view(new, self.live_dispatchers(now_ms)), change),
            (new, self._counters(metadata_version=version)),
        )

    def delete_topic(self, name: str) -> Result[DeleteTopicResult]:
        validate_topic(name)
        record = self.topics.get(name)
        if record is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        version = self.metadata_version + 1
        change = MetadataChange(self.metadata_version, version, remove=record.refs_by_broker())
        return Result(
            DeleteTopicResult(name, change),
            (new_topic_tombstone(name), self._counters(metadata_version=version)),
        )

    # ---- reads ---------------------------------------------------------------------------------------

    def describe_topic(self, name: str, now_ms: int) -> TopicView:
        validate_topic(name)
        record = self.topics.get(name)
        if record is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist")
        return self._view(record, self.live_dispatchers(now_ms))

    def list_topics(self, now_ms: int) -> list[TopicView]:
        dispatchers = self.live_dispatchers(now_ms)
        return [self._view(self.topics[n], dispatchers) for n in sorted(self.topics)]

    def metadata(self, topics: Sequence[str], now_ms: int) -> MetadataView:
        """Everything a client needs to route: brokers, dispatchers, and the requested topics (all when
        ``topics`` is empty); names that do not exist come back in ``unknown_topics``."""
        dispatchers = self.live_dispatchers(now_ms)
        if topics:
            wanted = list(dict.fromkeys(validate_topic(t) for t in topics))
            found = [self.topics[t] for t in wanted if t in self.topics]
            unknown = tuple(t for t in wanted if t not in self.topics)
        else:
            found = [self.topics[n] for n in sorted(self.topics)]
            unknown = ()
        return MetadataView(
            brokers=tuple(
                BrokerView(
                    b.broker_id,
                    b.endpoint,
                    self.broker_sessions.is_alive(b.broker_id, b.broker_epoch, now_ms),
                    b.rack,
                )
                for b in sorted(self.brokers.values(), key=lambda r: r.broker_id)
            ),
            dispatchers=tuple(
                DispatcherView(
                    d.dispatcher_id,
                    d.endpoint,
                    self.dispatcher_sessions.is_alive(d.dispatcher_id, d.dispatcher_epoch, now_ms),
                )
                for d in sorted(self.dispatchers.values(), key=lambda r: r.dispatcher_id)
            ),
            topics=tuple(self._view(t, dispatchers) for t in found),
            unknown_topics=unknown,
            metadata_version=self.metadata_version,
        )

    def partition_count(self) -> int:
        return sum(t.partitions for t in self.topics.values())

    def _view(self, record: TopicRecord, live_dispatchers: Sequence[str]) -> TopicView:
        routes = self._routes_of(record, live_dispatchers)
        return TopicView(
            record.name,
            record.topic_id,
            tuple(PartitionView(p, st.leader, routes[p], st) for p, st in enumerate(record.states)),
            record.config,
            record.created_ms,
            record.replication,
        )

    def _routes_of(self, record: TopicRecord, live_dispatchers: Sequence[str]) -> tuple[str, ...]:
        # Rendezvous hashing costs one hash per (partition, dispatcher); Metadata is called often, so keep
        # the answers until the set of live dispatchers changes.
        key = tuple(live_dispatchers)
        if key != self._routes_for:
            self._routes_for = key
            self._routes = {}
        cache_key = (record.name, record.topic_id)
        routes = self._routes.get(cache_key)
        if routes is None or len(routes) != record.partitions:
            routes = route_topic(record.name, record.partitions, key)
            self._routes[cache_key] = routes
        return routes

    # ---- timers --------------------------------------------------------------------------------------

    def expire(self, now_ms: int) -> tuple[list[int], list[str]]:
        """Sweep sessions past their timeout. Caller: the service layer's timer. Returns the brokers and
        dispatchers that just stopped being alive."""
        return self.broker_sessions.expire(now_ms), self.dispatcher_sessions.expire(now_ms)


def records_of(state: ClusterState) -> Iterable[Record]:
    """The records that rebuild ``state``'s durable part (used by tests to check replay round-trips)."""
    yield new_cluster_record(state.metadata_version, state.last_broker_epoch, state.last_dispatcher_epoch)
    yield from state.brokers.values()
    yield from state.dispatchers.values()
    yield from state.topics.values()
