"""The coordinator's service layer: the one writer of its state.

Each mutating call runs ``handler -> persist -> replay`` under one asyncio lock, so handlers always see the
state with every earlier change replayed, and records reach Redis in the order they are applied. Work that
need not be serialized (waiting for broker acknowledgements) happens after the lock is released.

If a write fails ambiguously (Redis error: maybe applied, maybe not) the in-memory state may differ from
Redis, so it is rebuilt from Redis before the next write. If the write is fenced (another coordinator took a
newer epoch) this coordinator refuses everything with NOT_COORDINATOR from then on.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from redis.asyncio import Redis

from sluice.common.names import validate_group
from sluice.coordinator.broker_updates import UNKNOWN_VERSION, BrokerNotifier
from sluice.coordinator.cluster.adopt import adopt_legacy_positions
from sluice.coordinator.cluster.model import (
    BrokerHeartbeatResult,
    BrokerUpdate,
    CreateTopicResult,
    DeleteTopicResult,
    Endpoint,
    MetadataChange,
    MetadataView,
    Registration,
    TopicConfig,
    TopicView,
)
from sluice.coordinator.cluster.redis_ops import copy_registrations, topic_ops, topic_sync_ops
from sluice.coordinator.cluster.state import ClusterSettings, ClusterState
from sluice.coordinator.config import CoordinatorConfig
from sluice.coordinator.election import CoordinatorElection
from sluice.coordinator.groups.assignment import AssignmentJob
from sluice.coordinator.groups.deletion import delete_group, deletion_ops, find_group_keys
from sluice.coordinator.groups.lag import LagReader, LagRow, lag_positions, time_lag
from sluice.coordinator.groups.model import (
    JOIN_EPOCH,
    GroupConfig,
    GroupDescription,
    GroupSettings,
    GroupState,
    GroupSummary,
    HeartbeatRequest,
    HeartbeatResponse,
    Slot,
    TickOutcome,
)
from sluice.coordinator.groups.redis_ops import GroupKeys, RedisOp, full_sync_ops, group_ops
from sluice.coordinator.groups.state import GroupsState
from sluice.coordinator.groups.tracks import topic_deleted
from sluice.coordinator.heap import HeapKeeper
from sluice.coordinator.metrics import CoordinatorMetrics, LagKey, coordinator_metrics
from sluice.coordinator.records import Result
from sluice.coordinator.state import CoordinatorState
from sluice.coordinator.store import MetadataStore
from sluice.errors import NotCoordinator, SluiceError, StorageError, UnknownGroup
from sluice.offsetstore.keys import Keys

log = logging.getLogger(__name__)

T = TypeVar("T")
Targets = dict[str, frozenset[Slot]]


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock milliseconds that never jump: wall time at start plus monotonic time elapsed since."""

    def __init__(self) -> None:
        self._wall0 = time.time()
        self._mono0 = time.monotonic()

    def now_ms(self) -> int:
        return int((self._wall0 + time.monotonic() - self._mono0) * 1000)


class CoordinatorService:
    """Domain-level API of the coordinator. Caller: the servicer (and tests)."""

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
        election: CoordinatorElection | None = None,
    ) -> None:
        #: None (--election none): this process leads from start() on, fencing older ones by epoch.
        self.election = election
        self._settings = settings
        self._group_settings = group_settings or GroupSettings()
        self._clock = clock or SystemClock()
        self._coordinator_endpoint = coordinator_endpoint
        self._offset_store = offset_store
        self._state = CoordinatorState(settings=settings, group_settings=self._group_settings)
        self._store = MetadataStore(redis, key_prefix, self._state.codec)
        self._redis = redis
        self._keys = Keys(key_prefix)
        self._group_keys = GroupKeys(key_prefix)
        self._lag = LagReader(redis, key_prefix)
        self._lag_interval_s = lag_interval_s
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
        )
        self._update_timeout_s = update_timeout_s
        self._timer: asyncio.Task[None] | None = None
        self._heap = HeapKeeper()
        #: (group, member id) -> how to tell that member to heartbeat now (its open heartbeat stream).
        self._watchers: dict[tuple[str, str], Callable[[], None]] = {}
        #: How to end each open heartbeat stream (at close, so the server's graceful stop need not wait).
        self._streams: set[Callable[[], None]] = set()

    @classmethod
    def from_config(
        cls,
        config: CoordinatorConfig,
        redis: Redis,
        coordinator_endpoint: Callable[[], Endpoint | None],
        election: CoordinatorElection | None = None,
    ) -> CoordinatorService:
        return cls(
            redis,
            config.key_prefix,
            config.cluster_settings(),
            update_timeout_s=config.broker_update_timeout.total_seconds(),
            coordinator_endpoint=coordinator_endpoint,
            offset_store=config.offset_store_endpoint(),
            group_settings=config.group_settings(),
            lag_interval_s=config.group_lag_interval.total_seconds(),
            election=election,
        )

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

    # ---- lifecycle -----------------------------------------------------------------------------------

    async def start(self, epoch: int | None = None) -> None:
        """Become the writer: rebuild state from Redis, start the timers.

        Without an election, take the next epoch (fencing every older coordinator). With one, ``epoch`` is
        the fencing token the elector just won; this runs again after every re-election.
        """
        async with self._lock:  # a write of an earlier term finishes (or is fenced) first
            self._epoch = epoch if epoch is not None else await self._store.acquire_epoch()
            self._fenced_by = None
            await self._reload()
            for b in self.cluster.brokers.values():
                self._notifier.registered(b.broker_id, b.endpoint, UNKNOWN_VERSION)
            self._metrics.epoch.set(self._epoch)
            self._refresh_metrics()
            # Whatever the ownership keys hold, the offset store must see exactly the recovered view. This
            # write reassigns nothing: it rewrites the same owners and epochs.
            await self._store.write(
                self._epoch,
                (),
                [
                    *full_sync_ops(self.groups, self._group_keys),
                    *topic_sync_ops(self.cluster.topics.values(), self._keys),
                ],
            )
            # Once per Redis: positions written before topic refs existed (cluster/adopt.py).
            await adopt_legacy_positions(
                self._redis,
                self._keys,
                frozenset(self.cluster.topics),
                lambda ops: self._store.write(self._epoch, (), ops),
            )
        await self._stop_timers()  # a re-election: fresh timers for the new term
        loop = asyncio.get_running_loop()
        self._timer = loop.create_task(self._expiry_loop(), name="coordinator-expiry")
        self._group_tasks = [loop.create_task(self._group_loop(), name="coordinator-groups")]
        if self._lag_interval_s > 0:
            self._group_tasks.append(loop.create_task(self._lag_loop(), name="coordinator-lag"))
        log.info(
            "coordinator epoch %d recovered %d consumer groups (%d members)",
            self._epoch,
            len(self.groups.groups),
            sum(len(g.members) for g in self.groups.groups.values()),
        )
        log.info(
            "coordinator epoch %d recovered %d brokers, %d dispatchers, %d topics at metadata version %d",
            self._epoch,
            len(self.cluster.brokers),
            len(self.cluster.dispatchers),
            len(self.cluster.topics),
            self.cluster.metadata_version,
        )

    async def step_down(self) -> None:
        """Leadership is over (election): stop the timers and drop the group and lag gauges, so this
        standby exports no stale state (the leader exports the current one). Requests are already
        refused (the guard)."""
        await self._stop_timers()
        self._metrics.clear_groups()
        self._exported_groups = set()
        self._lag_series = set()
        log.warning("coordinator epoch %d: no longer the leader", self._epoch)

    async def _stop_timers(self) -> None:
        tasks = [t for t in (self._timer, *self._group_tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._timer = None
        self._group_tasks = []

    async def close(self) -> None:
        for end in list(self._streams):
            end()
        await self._stop_timers()
        await self._notifier.close()
        await self._lag.close()

    async def _reload(self) -> None:
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

    async def _expiry_loop(self) -> None:
        tick = (
            min(self._settings.broker_session_timeout_ms, self._settings.dispatcher_session_timeout_ms) / 4000
        )
        tick = min(max(tick, 0.05), 1.0)
        while True:
            # A timer, not a poll: sessions expire by the passage of time alone.
            await asyncio.sleep(tick)
            now = self._clock.now_ms()
            brokers, dispatchers = self.cluster.expire(now)
            for b in brokers:
                log.warning("broker %d missed its heartbeats: marked not alive", b)
                self._metrics.session_expirations.labels("broker").inc()
            for d in dispatchers:
                log.warning("dispatcher %s missed its heartbeats: marked not alive", d)
                self._metrics.session_expirations.labels("dispatcher").inc()
            self._metrics.refresh(self.cluster, now)

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
                except StorageError:
                    self._reload_needed = True
                    raise
                for record in result.records:
                    self._state.replay(record)
                # Every write that touches a group is looked at, so a rebalance that starts and
                # settles between two timer ticks is still counted and timed.
                self._observe_rebalances(touched, self._clock.now_ms())
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

    def _publish(self, change: MetadataChange | None) -> list[asyncio.Future[bool]]:
        if change is None:
            return []
        return self._notifier.submit(change, self.cluster.live_brokers(self._clock.now_ms()))

    async def _await_acks(self, what: str, futures: Sequence[asyncio.Future[bool]]) -> None:
        if not futures:
            return
        done, pending = await asyncio.wait(futures, timeout=self._update_timeout_s + 1.0)
        failed = len(pending) + sum(1 for f in done if not f.result())
        if failed:
            log.warning(
                "%s: %d of %d brokers did not acknowledge; heartbeats will reconcile",
                what,
                failed,
                len(futures),
            )

    # ---- brokers and dispatchers ---------------------------------------------------------------------

    async def register_broker(self, broker_id: int, endpoint: Endpoint, incarnation: str) -> Registration:
        def committed(reg: Registration) -> None:
            if reg.new_incarnation:
                # A new process has applied nothing: it reports version 0 and gets a full assignment.
                self._notifier.registered(broker_id, endpoint, known_version=0)
                log.info("broker %d registered at %s with epoch %d", broker_id, endpoint, reg.epoch)
            self._publish(reg.change)

        return await self._write(
            lambda now: self.cluster.register_broker(broker_id, endpoint, incarnation, now), committed
        )

    async def broker_heartbeat(
        self, broker_id: int, broker_epoch: int, metadata_version: int
    ) -> BrokerHeartbeatResult:
        def committed(res: BrokerHeartbeatResult) -> None:
            if res.error is None:
                self._notifier.observed(broker_id, metadata_version)
                self._publish(res.change)

        return await self._write(
            lambda now: self.cluster.broker_heartbeat(broker_id, broker_epoch, metadata_version, now),
            committed,
        )

    async def register_dispatcher(
        self, dispatcher_id: str, endpoint: Endpoint, incarnation: str
    ) -> Registration:
        def committed(reg: Registration) -> None:
            if reg.new_incarnation:
                log.info("dispatcher %s registered at %s with epoch %d", dispatcher_id, endpoint, reg.epoch)
            self._publish(reg.change)

        return await self._write(
            lambda now: self.cluster.register_dispatcher(dispatcher_id, endpoint, incarnation, now), committed
        )

    # ---- topics --------------------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int, config: TopicConfig) -> TopicView:
        """Create, persist, then wait (bounded) until the hosting brokers acknowledged the new partitions,
        so that a produce right after this returns finds them."""
        topic_id = uuid.uuid4().hex
        acks: list[asyncio.Future[bool]] = []
        result: CreateTopicResult = await self._write(
            lambda now: self.cluster.create_topic(name, partitions, config, topic_id, now),
            lambda res: acks.extend(self._publish(res.change)),
        )
        log.info("created topic %s (%d partitions, id %s)", name, partitions, topic_id)
        await self._await_acks(f"create topic {name}", acks)
        return result.topic

    async def add_partitions(self, name: str, partitions: int) -> TopicView:
        acks: list[asyncio.Future[bool]] = []
        result: CreateTopicResult = await self._write(
            lambda now: self.cluster.add_partitions(name, partitions, now),
            lambda res: acks.extend(self._publish(res.change)),
        )
        log.info("topic %s grown to %d partitions", name, partitions)
        await self._await_acks(f"add partitions to {name}", acks)
        return result.topic

    async def delete_topic(self, name: str) -> None:
        acks: list[asyncio.Future[bool]] = []

        def delete(now_ms: int) -> Result[DeleteTopicResult]:
            # The groups forget the topic's bindings in the same write as its tombstone and purge.
            deleted = self.cluster.delete_topic(name)
            forget = topic_deleted(self.groups.groups.values(), name, now_ms)
            return Result(deleted.response, (*deleted.records, *forget))

        await self._write(delete, lambda res: acks.extend(self._publish(res.change)))
        log.info("deleted topic %s", name)
        await self._await_acks(f"delete topic {name}", acks)

    def list_topics(self) -> list[TopicView]:
        self._check_leader()
        return self.cluster.list_topics(self._clock.now_ms())

    def describe_topic(self, name: str) -> TopicView:
        self._check_leader()
        return self.cluster.describe_topic(name, self._clock.now_ms())

    def metadata(self, topics: Sequence[str]) -> MetadataView:
        self._check_leader()
        return self.cluster.metadata(topics, self._clock.now_ms())

    @property
    def coordinator_endpoint(self) -> Endpoint | None:
        return self._coordinator_endpoint()

    @property
    def offset_store(self) -> Endpoint | None:
        return self._offset_store

    # ---- consumer groups -----------------------------------------------------------------------------

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        if request.member_epoch > 0 and not self._reload_needed:
            # A heartbeat that changes nothing durable is answered without the write lock, so steady
            # heartbeats never queue behind a write waiting for Redis (groups.md, "Speed").
            self._check_leader()
            quick = self.groups.quick_heartbeat(request, self._clock.now_ms())
            if quick is not None:
                return quick
        # Only a join may need a new member id: a steady heartbeat does not pay for a uuid (a syscall).
        new_id = uuid.uuid4().hex if request.member_epoch == JOIN_EPOCH and not request.member_id else ""
        group = request.group
        return await self._write(
            lambda now: self.groups.heartbeat(request, now, new_id),
            requester=lambda response: (group, response.member_id),
        )

    def watch(self, group: str, member_id: str, nudge: Callable[[], None]) -> Callable[[], None]:
        """Call ``nudge`` (sync, cheap) whenever a write means this member must heartbeat now to make
        progress (members_to_nudge). One watcher per member: the newest stream wins. Returns the
        function that removes this watcher (a no-op once a newer one replaced it).
        Caller: the servicer's heartbeat stream."""
        key = (group, member_id)
        self._watchers[key] = nudge

        def unwatch() -> None:
            if self._watchers.get(key) is nudge:
                del self._watchers[key]

        return unwatch

    def stream_opened(self, end: Callable[[], None]) -> Callable[[], None]:
        """Register an open heartbeat stream; ``end()`` finishes it. Returns the deregistration."""
        self._streams.add(end)
        return lambda: self._streams.discard(end)

    async def leave_group(self, group: str, member_id: str, member_epoch: int) -> None:
        await self._write(lambda now: self.groups.leave(group, member_id, member_epoch, now))

    async def set_group_config(self, group: str, config: GroupConfig, policy_given: bool) -> GroupConfig:
        return await self._write(lambda now: self.groups.set_config(group, config, policy_given, now))

    def list_groups(self) -> list[GroupSummary]:
        self._check_leader()
        return self.groups.list_groups()

    async def describe_group(
        self, group: str
    ) -> tuple[GroupDescription | None, list[LagRow], list[tuple[int, int] | None]]:
        """The group, its lag, and per lag row the lag in time (``lag.time_lag``). A group the coordinator
        does not know but that has committed offsets (e.g. only reset so far) is described from its offsets
        alone (description None). The lag in time costs one Fetch per broker of the lagging partitions
        (``LagReader.record_timestamps``), as the lag refresh does."""
        self._check_leader()
        try:
            description: GroupDescription | None = self.groups.describe(group)
        except UnknownGroup:
            description = None
        rows = await self._lag.rows(self.cluster, description, group)
        if description is None and not any(r.committed >= 0 for r in rows):
            raise UnknownGroup(f"group {group!r} does not exist (no members, no committed offsets)")
        if description is not None:
            description = await self._lag.with_handovers(group, description)
        lagging = lag_positions(rows)
        stamps = await self._lag.record_timestamps(self.cluster, lagging) if lagging else {}
        now_ms = self._clock.now_ms()
        return description, rows, [time_lag(r, stamps, now_ms) for r in rows]

    async def delete_group(self, group: str) -> int:
        """DeleteGroup (groups/deletion.py): the group's records and every Redis key it left, at once;
        refused while it has members. Returns the number of committed offsets deleted."""
        validate_group(group)
        self._check_leader()
        found = await find_group_keys(self._redis, self._keys, group)
        deleted = await self._write(
            lambda now: delete_group(self.groups, group, found), extra_ops=deletion_ops(found, self._keys)
        )
        self.groups.soft.groups.pop(group, None)
        log.info("group %s deleted: %d keys, %d committed offsets", group, len(found.keys), deleted)
        return deleted

    async def _group_loop(self) -> None:
        """The groups' timer: throttled target assignments and topic changes every 50 ms; sessions and
        rebalance deadlines every 250 ms; gauges every second."""
        period, sweep_every, gauges_every = 0.05, 5, 20
        n = 0
        while True:
            await asyncio.sleep(period)
            n += 1
            sweep = n % sweep_every == 0

            def tick(now: int, sweep: bool = sweep) -> Result[TickOutcome]:
                return self.groups.tick(now, sweep, assign_inline=False)

            try:
                for _ in range(64):  # one group per write; bounded so a huge backlog yields to requests
                    outcome = await self._write(tick)
                    for group, member, reason in outcome.removed:
                        log.warning("group %s: member %s removed (%s)", group, member, reason)
                        self._metrics.count_fenced(group, reason)
                    for group, topic, expr, track in outcome.expired_tracks:
                        log.info(
                            "group %s: offsets of topic %s read with filter %r (track %s) expired: "
                            "unread for --group-offsets-retention",
                            group,
                            topic,
                            expr,
                            track,
                        )
                    if not outcome.changed:
                        break
                await self._assign_due_groups()
            except SluiceError as exc:
                log.warning("group timer: %s", exc)
            if n % gauges_every == 0:
                self._exported_groups = self._metrics.refresh_groups(self.groups, self._exported_groups)
                self._heap.tick()

    async def _assign_due_groups(self) -> None:
        """Compute the throttled target assignments in a worker thread, from a snapshot, outside the
        write lock; then write each as records under it (groups/assignment.py). Heartbeats keep being
        answered meanwhile (the thread yields the GIL every few milliseconds)."""
        for job in self.groups.assignment_jobs(self._clock.now_ms()):
            try:
                started = time.perf_counter()
                targets = await asyncio.to_thread(job.compute)
                took = time.perf_counter() - started
                if took > 0.5:
                    log.info(
                        "group %s: target of %d members computed in %.2fs", job.group, len(job.members), took
                    )
            except BaseException:
                self.groups.abandon_assignment(job)
                raise

            def apply(now: int, job: AssignmentJob = job, targets: Targets = targets) -> Result[TickOutcome]:
                return self.groups.apply_assignment(job, targets, now)

            try:
                await self._write(apply)
            except SluiceError:
                self.groups.abandon_assignment(job)
                raise

    def _observe_rebalances(self, touched: set[str], now_ms: int) -> None:
        for name in touched:
            g = self.groups.groups.get(name)
            soft = self.groups.soft.group(name)
            settled = g is None or g.state() in (GroupState.STABLE, GroupState.EMPTY)
            if not settled and soft.rebalancing_since_ms is None:
                soft.rebalancing_since_ms = now_ms
                self._metrics.rebalances.labels(name).inc()
            elif settled and soft.rebalancing_since_ms is not None:
                self._metrics.rebalance_duration.labels(name).observe(
                    max(0, now_ms - soft.rebalancing_since_ms) / 1000
                )
                soft.rebalancing_since_ms = None

    async def _lag_loop(self) -> None:
        while True:
            await asyncio.sleep(self._lag_interval_s)
            try:
                await self.refresh_lag()
            except SluiceError as exc:
                log.warning("consumer lag refresh: %s", exc)

    async def refresh_lag(self) -> None:
        """Set ``sluice_coordinator_consumer_lag`` (records) and ``_consumer_lag_seconds`` for every group
        (the largest over a broadcasting group's members); remove the series of partitions no group
        reads any more.

        Seconds behind = now - timestamp of the first unconsumed record, read per group with one Fetch
        per broker for the lagging partitions (``LagReader.record_timestamps``); 0 when caught up, no
        series while that record cannot be read."""
        lag: dict[LagKey, int] = {}
        seconds: dict[LagKey, float] = {}
        for name in sorted(self.groups.groups):
            try:
                description: GroupDescription | None = self.groups.lag_view(name)
            except UnknownGroup:
                description = None
            rows = await self._lag.rows(self.cluster, description, name)
            lagging = lag_positions(rows)
            stamps = await self._lag.record_timestamps(self.cluster, lagging) if lagging else {}
            now_ms = self._clock.now_ms()
            for row in rows:
                if row.lag < 0:
                    continue
                key = (name, row.track, row.topic, str(row.partition))
                lag[key] = max(lag.get(key, 0), row.lag)
                behind = time_lag(row, stamps, now_ms)
                if behind is not None:
                    seconds[key] = max(seconds.get(key, 0.0), behind[0] / 1000)
        self._lag_series = self._metrics.set_lag(lag, seconds, self._lag_series)
