"""The coordinator's one writer of its state: the write path every mutating call goes through.

Each mutating call runs ``handler -> persist -> replay`` under one asyncio lock, so handlers always see the
state with every earlier change replayed, and records reach Redis in the order they are applied. Work that
need not be serialized (waiting for broker acknowledgements) happens after the lock is released.

If a write fails ambiguously (Redis error: maybe applied, maybe not) the in-memory state may differ from
Redis, so it is rebuilt from Redis before the next write. If the write is fenced (another coordinator took a
newer epoch) this coordinator refuses everything with NOT_COORDINATOR from then on.

``timers.py`` adds the timers and ``service.py`` the domain API on top of :class:`CoordinatorWriter`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from redis.asyncio import Redis

from sluice.coordinator.broker_updates import BrokerNotifier, PushOutcome
from sluice.coordinator.cluster.model import BrokerUpdate, Endpoint, MetadataChange
from sluice.coordinator.cluster.redis_ops import copy_registrations, topic_ops
from sluice.coordinator.cluster.state import ClusterSettings, ClusterState
from sluice.coordinator.election import CoordinatorElection
from sluice.coordinator.group_metrics import GroupMetricsPolicy
from sluice.coordinator.groups.lag import LagReader
from sluice.coordinator.groups.log_end import LogEndCache
from sluice.coordinator.groups.model import GroupSettings, GroupState
from sluice.coordinator.groups.redis_ops import GroupKeys, group_ops
from sluice.coordinator.groups.state import GroupsState
from sluice.coordinator.heap import HeapKeeper
from sluice.coordinator.metrics import CoordinatorMetrics, LagKey, coordinator_metrics
from sluice.coordinator.ops import RedisOp
from sluice.coordinator.producer_ids import DEFAULT_PER_MINUTE, ProducerIdBlocks, ProducerIdQuota
from sluice.coordinator.records import Result
from sluice.coordinator.state import CoordinatorState
from sluice.coordinator.store import MetadataStore
from sluice.coordinator.topic_acks import IncompleteTopics
from sluice.errors import NotCoordinator, NotEnoughReplicas, StorageError
from sluice.offsetstore.keys import Keys
from sluice.offsetstore.storage import ReplicaWait

log = logging.getLogger(__name__)

T = TypeVar("T")


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock milliseconds that never jump: wall time at start plus monotonic time elapsed since."""

    def __init__(self) -> None:
        self._wall0 = time.time()
        self._mono0 = time.monotonic()

    def now_ms(self) -> int:
        return int((self._wall0 + time.monotonic() - self._mono0) * 1000)


class CoordinatorWriter:
    """The state, its Redis store and the write path (lock, fencing, reload, nudges of streaming members)."""

    def __init__(
        self,
        redis: Redis,
        key_prefix: str,
        settings: ClusterSettings,
        *,
        update_timeout_s: float,
        clock: Clock | None = None,
        coordinator_endpoint: Callable[[], Endpoint | None] = lambda: None,
        offset_store: Endpoint | None = None,
        group_settings: GroupSettings | None = None,
        lag_interval_s: float = 10.0,
        group_metrics: GroupMetricsPolicy | None = None,
        election: CoordinatorElection | None = None,
        producer_ids_per_minute: int = DEFAULT_PER_MINUTE,
        metadata_wait: ReplicaWait | None = None,
    ) -> None:
        #: None (--election none): this process leads from start() on, fencing older ones by epoch.
        self.election = election
        self._settings = settings
        self._group_settings = group_settings or GroupSettings()
        self._clock = clock or SystemClock()
        self._coordinator_endpoint = coordinator_endpoint
        self._offset_store = offset_store
        self._state = CoordinatorState(settings=settings, group_settings=self._group_settings)
        self._store = MetadataStore(redis, key_prefix, self._state.codec, metadata_wait)
        self._producer_blocks = ProducerIdBlocks(redis, key_prefix, self._store.epoch_key)
        self._producer_quota = ProducerIdQuota(producer_ids_per_minute)
        self._redis = redis
        self._keys = Keys(key_prefix)
        self._group_keys = GroupKeys(key_prefix)
        self._lag = LagReader(redis, key_prefix)
        #: High watermarks shared by every group's lag (one ListOffsets per partition per refresh).
        self._log_end = LogEndCache(self._lag.high_watermarks)
        self._lag_interval_s = lag_interval_s
        self._group_metrics = group_metrics or GroupMetricsPolicy()
        #: Group -> when (monotonic s) DescribeGroup last asked about it: its lag is refreshed a while.
        self._asked: dict[str, float] = {}
        self._asked_seen: frozenset[str] = frozenset()
        #: Set by a group write while the group timer sleeps long (no live group): it looks again.
        self._group_wake = asyncio.Event()
        self._group_idle = False
        self._group_tasks: list[asyncio.Task[None]] = []
        self._exported_groups: set[str] = set()
        self._lag_series: set[LagKey] = set()
        self._lock = asyncio.Lock()
        self._epoch = 0
        self._fenced_by: str | None = None
        self._reload_needed = False
        self._metrics: CoordinatorMetrics = coordinator_metrics()
        self._notifier = BrokerNotifier(
            self._full_update,
            update_timeout_s,
            self._metrics.count_update,
            controller_epoch=lambda: self._epoch,
        )
        self._update_timeout_s = update_timeout_s
        self._timer: asyncio.Task[None] | None = None
        self._heap = HeapKeeper()
        #: Topic changes a broker did not acknowledge: a retry of the same request completes them.
        self._incomplete = IncompleteTopics()
        #: (group, member id) -> how to tell that member to heartbeat now (its open heartbeat stream).
        self._watchers: dict[tuple[str, str], Callable[[], None]] = {}
        #: How to end each open heartbeat stream (at close, so the server's graceful stop need not wait).
        self._streams: set[Callable[[], None]] = set()

    def _full_update(self, broker_id: int) -> BrokerUpdate:
        # Looked up at call time: a reload replaces the state object.
        return self.cluster.broker_assignment(broker_id)

    @property
    def cluster(self) -> ClusterState:
        return self._state.cluster

    @property
    def groups(self) -> GroupsState:
        return self._state.groups

    @property
    def epoch(self) -> int:
        return self._epoch

    async def _reload(self) -> None:
        # Under --metadata-replicas, read back only what the replicas hold too (store.barrier): a write
        # refused NOT_ENOUGH_REPLICAS is still on the primary and must not be acted on through a reload.
        await self._store.barrier(self._epoch)
        records = await self._store.load()
        old = self._state.cluster
        # Keep soft liveness across a reload: it is not in Redis.
        fresh = CoordinatorState(
            ClusterState(self._settings, old.broker_sessions, old.dispatcher_sessions),
            group_settings=self._group_settings,
            group_soft=self._state.groups.soft,
        )
        fresh.replay_all(records)
        self._state = fresh
        self._reload_needed = False

    def _refresh_metrics(self) -> None:
        self._metrics.refresh(self.cluster, self._clock.now_ms())

    def _check_leader(self) -> None:
        if self.election is not None:
            self.election.guard()  # NOT_COORDINATOR naming the leader, unless we are it
        if self._fenced_by is not None:
            raise NotCoordinator(self._fenced_by)

    # ---- the write path ------------------------------------------------------------------------------

    async def _write(
        self,
        handler: Callable[[int], Result[T]],
        on_commit: Callable[[T], None] | None = None,
        requester: Callable[[T], tuple[str, str] | None] | None = None,
        extra_ops: Sequence[RedisOp] = (),
    ) -> T:
        """Run ``handler`` on the current state, persist its records atomically, replay them, then run
        ``on_commit`` (still under the lock, so pushes queue in version order) and tell the streaming
        members the write concerns to heartbeat now (except ``requester(response)``, who has its answer).
        ``extra_ops`` are key operations written with the records, if the handler succeeds."""
        async with self._lock:
            self._check_leader()
            if self._reload_needed:
                await self._reload()
            result = handler(self._clock.now_ms())
            nudge: list[tuple[str, str]] = []
            if result.records or extra_ops:
                touched = self.groups.touched_groups(result.records)
                ops = group_ops(self.groups, result.records, self._group_keys) if touched else []
                ops = [*ops, *extra_ops]
                # Topic identity (and the purge of a deleted topic's offsets and cursors) lands in the
                # same atomic write as the topic record: docs/redis-schema.md.
                ops += copy_registrations(ops, self._keys)
                ops += topic_ops(result.records, self._keys)
                basis = (
                    self.groups.nudge_basis(result.records, touched) if touched and self._watchers else None
                )
                try:
                    await self._store.write(self._epoch, result.records, ops)
                except NotCoordinator as exc:
                    self._fenced_by = exc.message
                    log.error("fenced: %s", exc.message)
                    if self.election is not None:
                        self.election.fenced()  # step down; a new term (new epoch) clears _fenced_by
                    raise
                except (StorageError, NotEnoughReplicas):
                    # Outcome unknown, or on the primary alone (not acted on, not pushed: a failover
                    # could lose it): the next write reloads what Redis holds.
                    self._reload_needed = True
                    raise
                for record in result.records:
                    self._state.replay(record)
                # Every write that touches a group is looked at, so a rebalance that starts and
                # settles between two timer ticks is still counted and timed.
                self._observe_rebalances(touched, self._clock.now_ms())
                if touched and self._group_idle:
                    self._group_wake.set()
                if len(touched) < len(result.records):
                    self._refresh_metrics()
                if basis is not None:
                    nudge = self.groups.members_to_nudge(result.records, basis)
            if on_commit is not None:
                on_commit(result.response)
            if nudge:
                skip = requester(result.response) if requester is not None else None
                for key in nudge:
                    watcher = self._watchers.get(key)
                    if watcher is not None and key != skip:
                        watcher()
            return result.response

    def _publish(self, change: MetadataChange | None) -> dict[int, asyncio.Future[PushOutcome]]:
        if change is None:
            return {}
        return self._notifier.submit(change, self.cluster.live_brokers(self._clock.now_ms()))

    def _ack_wait_s(self, partitions: int) -> float:
        """How long a topic change waits for the brokers: the push's deadline, then two heartbeats (a push
        left unanswered is settled by the broker's next heartbeat reporting its version, and a broker that
        missed it applies its full assignment from the heartbeat after), plus 1 s."""
        heartbeat_s = self._settings.broker_heartbeat_interval_ms / 1000
        return self._notifier.deadline_s(partitions) + 2 * heartbeat_s + 1.0

    def _exporting(self, name: str) -> bool:
        """Whether ``name`` has per-group series (``group_metrics.py``). A group not exported yet is
        taken in at once while there is room (so a new group's first rebalance is counted before the
        next gauge refresh); that refresh keeps it or removes its series."""
        if name in self._exported_groups:
            return True
        policy = self._group_metrics
        if len(self._exported_groups) >= policy.max_groups or (policy.patterns and not policy.named(name)):
            return False
        self._exported_groups.add(name)
        self._metrics.start_group_series(name)
        return True

    def _observe_rebalances(self, touched: set[str], now_ms: int) -> None:
        for name in touched:
            g = self.groups.groups.get(name)
            if g is None:  # deleted or expired: no soft state to keep (nor to re-create here)
                self.groups.soft.groups.pop(name, None)
                continue
            if not self._exporting(name):
                continue
            soft = self.groups.soft.group(name)
            settled = g.state() in (GroupState.STABLE, GroupState.EMPTY)
            if not settled and soft.rebalancing_since_ms is None:
                soft.rebalancing_since_ms = now_ms
                self._metrics.rebalances.labels(name).inc()
            elif settled and soft.rebalancing_since_ms is not None:
                self._metrics.rebalance_duration.labels(name).observe(
                    max(0, now_ms - soft.rebalancing_since_ms) / 1000
                )
                soft.rebalancing_since_ms = None
