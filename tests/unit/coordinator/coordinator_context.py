"""A TestContext for the pure cluster state machine: a fake clock, and handlers applied like the service does.

``ctx.apply(result)`` persists (into an in-memory compacted log, through the real codec) and replays the
records, exactly as the service layer does with Redis; ``ctx.advance(ms)`` moves the clock and fires the
session-expiry timer.
"""

from __future__ import annotations

from typing import TypeVar

from sluice.coordinator.cluster.model import (
    BrokerHeartbeatResult,
    CreateTopicResult,
    DeleteTopicResult,
    Endpoint,
    Registration,
    TopicConfig,
)
from sluice.coordinator.cluster.replication import DEFAULT_SPEC, ReplicationSpec
from sluice.coordinator.cluster.state import ClusterSettings, ClusterState
from sluice.coordinator.records import RecordValue, Result, record_field
from sluice.coordinator.state import CoordinatorState

T = TypeVar("T")

SETTINGS = ClusterSettings(
    broker_heartbeat_interval_ms=1_000,
    broker_session_timeout_ms=5_000,
    dispatcher_heartbeat_interval_ms=1_000,
    dispatcher_session_timeout_ms=5_000,
)


class ClusterContext:
    def __init__(self, settings: ClusterSettings = SETTINGS, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms
        self.root = CoordinatorState(settings=settings)
        self.state: ClusterState = self.root.cluster
        #: The "Redis hash": field -> encoded record, with tombstones removing fields.
        self.store: dict[str, bytes] = {}
        self.expired: list[int] = []
        self._topic_ids = 0

    # ---- clock --------------------------------------------------------------------------

    def advance(self, ms: int) -> None:
        self.now_ms += ms
        brokers, _ = self.state.expire(self.now_ms)
        self.expired.extend(brokers)

    # ---- the service layer's write path, minus I/O ---------------------------------------------------

    def apply(self, result: Result[T]) -> T:
        for record in result.records:
            field, value = self.root.codec.encode(record)
            if value is None:
                self.store.pop(field, None)
            else:
                self.store[field] = value
            assert field == record_field(record)
            self.root.replay(record)
        return result.response

    def register_broker(
        self, broker_id: int, port: int | None = None, incarnation: str = "i1", rack: str = ""
    ) -> Registration:
        endpoint = Endpoint("127.0.0.1", port or 9000 + broker_id)
        return self.apply(self.state.register_broker(broker_id, endpoint, incarnation, self.now_ms, rack))

    def heartbeat(self, broker_id: int, epoch: int, version: int) -> BrokerHeartbeatResult:
        return self.apply(self.state.broker_heartbeat(broker_id, epoch, version, self.now_ms))

    def register_dispatcher(
        self, dispatcher_id: str, port: int = 8000, incarnation: str = "d1"
    ) -> Registration:
        endpoint = Endpoint("127.0.0.1", port)
        return self.apply(self.state.register_dispatcher(dispatcher_id, endpoint, incarnation, self.now_ms))

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: TopicConfig | None = None,
        spec: ReplicationSpec = DEFAULT_SPEC,
    ) -> CreateTopicResult:
        self._topic_ids += 1
        return self.apply(
            self.state.create_topic(
                name, partitions, config or TopicConfig(), f"id-{self._topic_ids}", self.now_ms, spec
            )
        )

    def delete_topic(self, name: str) -> DeleteTopicResult:
        return self.apply(self.state.delete_topic(name))

    # ---- recovery --------------------------------------------------------------------------

    def recover(self) -> ClusterState:
        """A fresh state rebuilt from the stored records, as a restarted coordinator does."""
        fresh = CoordinatorState(settings=self.state.settings)
        records: list[RecordValue] = [self.root.codec.decode(f, v) for f, v in self.store.items()]
        fresh.replay_all(records)
        return fresh.cluster


def durable(state: ClusterState) -> dict[str, object]:
    """The durable part of a cluster state, for equality checks."""
    return {
        "metadata_version": state.metadata_version,
        "last_broker_epoch": state.last_broker_epoch,
        "last_dispatcher_epoch": state.last_dispatcher_epoch,
        "brokers": dict(state.brokers),
        "dispatchers": dict(state.dispatchers),
        "topics": dict(state.topics),
    }
