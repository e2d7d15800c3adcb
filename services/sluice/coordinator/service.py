"""The coordinator's service layer: the domain API (brokers, dispatchers, topics, consumer groups) and the
lifecycle of a term (start, step down, close). Caller: the servicer.

Every mutating call goes through the one write path, ``writer.py`` (:class:`CoordinatorWriter`: handler ->
persist -> replay under one lock, fencing, reload after an ambiguous failure); the timers are ``timers.py``.
The service is the last of that chain of classes, so each module holds one concern.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence

from redis.asyncio import Redis

from sluice.common.names import validate_group
from sluice.coordinator.broker_updates import UNKNOWN_VERSION
from sluice.coordinator.cluster.adopt import adopt_legacy_positions
from sluice.coordinator.cluster.model import (
    BrokerHeartbeatResult,
    Endpoint,
    MetadataView,
    Registration,
    TopicView,
)
from sluice.coordinator.cluster.rebuild import EpochReport
from sluice.coordinator.cluster.redis_ops import topic_sync_ops
from sluice.coordinator.cluster.sessions import Liveness
from sluice.coordinator.cluster.state import ClusterState
from sluice.coordinator.cluster.strays import stray_replicas, unknown_logs
from sluice.coordinator.cluster.unclean import LogReport
from sluice.coordinator.config import CoordinatorConfig
from sluice.coordinator.election import CoordinatorElection
from sluice.coordinator.groups.deletion import delete_group, deletion_ops, find_group_keys
from sluice.coordinator.groups.lag import LagRow, lag_positions, time_lag
from sluice.coordinator.groups.model import (
    JOIN_EPOCH,
    GroupConfig,
    GroupDescription,
    GroupSummary,
    HeartbeatRequest,
    HeartbeatResponse,
)
from sluice.coordinator.groups.redis_ops import full_sync_ops
from sluice.coordinator.limits import mutation_key
from sluice.coordinator.producer_ids import ProducerIdentity, init_producer_id
from sluice.coordinator.topic_ops import CoordinatorTopics
from sluice.coordinator.writer import Clock, SystemClock
from sluice.errors import InvalidRequest, NotCoordinator, UnknownGroup

log = logging.getLogger(__name__)

#: The highest controller epoch a broker may report having obeyed. Terms are taken one INCR per election,
#: so no cluster comes near it (2**40 terms: one a second for 34,000 years); a larger one is not a report
#: but bad input, and believing it would put the next term out of Redis's INCR range, leaving the
#: coordinator NOT_COORDINATOR for good (found by the fuzz suite: one BrokerHeartbeat did it).
MAX_CONTROLLER_EPOCH = 2**40
#: The same bound on the metadata version a broker reports having applied (one version per change).
MAX_METADATA_VERSION = 2**40

__all__ = ["Clock", "CoordinatorService", "SystemClock"]


class CoordinatorService(CoordinatorTopics):
    """Domain-level API of the coordinator. Caller: the servicer (and tests)."""

    @classmethod
    def from_config(
        cls,
        config: CoordinatorConfig,
        redis: Redis,
        coordinator_endpoint: Callable[[], Endpoint | None],
        election: CoordinatorElection | None = None,
    ) -> CoordinatorService:
        service = cls(
            redis,
            config.key_prefix,
            config.cluster_settings(),
            update_timeout_s=config.broker_update_timeout.total_seconds(),
            coordinator_endpoint=coordinator_endpoint,
            offset_store=config.offset_store_endpoint(),
            group_settings=config.group_settings(),
            lag_interval_s=config.group_lag_interval.total_seconds(),
            group_metrics=config.group_metrics_policy(),
            election=election,
            producer_ids_per_minute=config.producer_ids_per_minute,
            metadata_wait=config.metadata_wait(),
        )
        service.set_limits(config.coordinator_limits())
        return service

    # ---- lifecycle -----------------------------------------------------------------------------------

    async def start(self, epoch: int | None = None) -> None:
        """Become the writer: rebuild state from Redis, start the timers.

        Without an election, take the next epoch (fencing every older coordinator). With one, ``epoch`` is
        the fencing token the elector just won; this runs again after every re-election.
        """
        async with self._lock:  # a write of an earlier term finishes (or is fenced) first
            self._epoch = epoch if epoch is not None else await self._store.acquire_epoch()
            self._fenced_by = None
            self._producer_blocks.forget()  # a block reserved under an older term is never reused
            await self._reload()
            now = self._clock.now_ms()
            for b in self.cluster.brokers.values():
                self._notifier.registered(b.broker_id, b.endpoint, UNKNOWN_VERSION)
                self.cluster.broker_sessions.watch(b.broker_id, b.broker_epoch, now)
            self._metrics.epoch.set(self._epoch)
            self._refresh_metrics()
            # The offset store must see exactly the recovered view: the same owners and epochs again.
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
        await self._complete_pending_reassignments()
        await self._stop_timers()  # a re-election: fresh timers for the new term
        loop = asyncio.get_running_loop()
        self._timer = loop.create_task(self._expiry_loop(), name="coordinator-expiry")
        self._group_tasks = [loop.create_task(self._group_loop(), name="coordinator-groups")]
        if self._lag_interval_s > 0:
            self._group_tasks.append(loop.create_task(self._lag_loop(), name="coordinator-lag"))
        self._group_tasks.append(self._begin_rebuild())  # rebuilding.py: elections wait for reports
        if self.cluster.settings.auto_leader_rebalance:
            self._group_tasks.append(loop.create_task(self._rebalance_loop(), name="coordinator-rebalance"))
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

    async def close(self) -> None:
        for end in list(self._streams):
            end()
        await self._stop_timers()
        await self._notifier.close()
        await self._lag.close()

    # ---- brokers and dispatchers ---------------------------------------------------------------------

    async def register_broker(
        self,
        broker_id: int,
        endpoint: Endpoint,
        incarnation: str,
        rack: str = "",
        controller_epoch: int = 0,
        logs: Sequence[LogReport] = (),
        unclean: bool = False,
    ) -> Registration:
        """``logs``: every log the broker holds; ``unclean``: it restarted without a clean shutdown."""
        await self._catch_up_epoch(broker_id, controller_epoch)

        def committed(reg: Registration) -> None:
            if reg.new_incarnation:
                # A new process has applied nothing: it reports version 0 and gets a full assignment.
                self._notifier.registered(broker_id, endpoint, known_version=0)
                log.info("broker %d registered at %s with epoch %d", broker_id, endpoint, reg.epoch)
            self._publish(reg.change)

        reg = await self._write(
            lambda now: self.cluster.register_broker(broker_id, endpoint, incarnation, now, rack), committed
        )
        if unclean:  # out of every ISR and ELR before anything can elect it (KIP-966)
            await self.replicas_unfit(broker_id, logs, unclean=True)
        self._remember_logs(broker_id, logs)
        strays = stray_replicas(self.cluster, broker_id, logs)
        if strays:
            log.info(
                "broker %d holds %d log(s) of partitions it is no longer a replica of (moved while it was "
                "away): removing them, e.g. %s/%d",
                broker_id,
                len(strays),
                strays[0].topic,
                strays[0].partition,
            )
            self._notifier.owe_removals(broker_id, strays)
        unknown = unknown_logs(self.cluster, logs)
        if unknown:
            log.warning(
                "broker %d holds %d log(s) of topics this controller does not know (deleted while it was "
                "down, or metadata lost), kept: e.g. %s/%d (topic id %s); delete them by hand once sure",
                broker_id,
                len(unknown),
                unknown[0].topic,
                unknown[0].partition,
                unknown[0].topic_id,
            )
        await self._elect_offline(f"broker {broker_id} registered")
        return reg

    async def broker_heartbeat(
        self,
        broker_id: int,
        broker_epoch: int,
        metadata_version: int,
        controller_epoch: int = 0,
        reports: Sequence[EpochReport] = (),
    ) -> BrokerHeartbeatResult:
        if metadata_version > MAX_METADATA_VERSION:
            # Believed, it put our version one past int64's range (the broker is "ahead": we jump past
            # it), and every later update to any broker failed INTERNAL: found by the fuzz suite's count
            # of internal errors, as MAX_CONTROLLER_EPOCH was by its tracebacks.
            raise InvalidRequest(
                f"metadata_version {metadata_version} was never issued (at most {MAX_METADATA_VERSION})"
            )
        await self._catch_up_epoch(broker_id, controller_epoch)

        def committed(res: BrokerHeartbeatResult) -> None:
            if res.error is None:
                self._notifier.observed(broker_id, metadata_version)
                self._publish(res.change)

        revived = self.cluster.broker_liveness(broker_id, self._clock.now_ms()) is Liveness.EXPIRED
        res = await self._write(
            lambda now: self.cluster.broker_heartbeat(broker_id, broker_epoch, metadata_version, now),
            committed,
        )
        if res.error is None:
            await self._term_heartbeat(broker_id, reports)
            if revived:
                await self._elect_offline(f"broker {broker_id} is back")
        res = self._term_assignment(broker_id, res)
        if res.update is None:
            return res
        return dataclasses.replace(res, update=self._notifier.with_owed_removals(broker_id, res.update))

    async def _catch_up_epoch(self, broker_id: int, seen: int) -> None:
        """A broker obeyed a controller epoch above ours (Redis lost it): raise the stored epoch to it and
        take a new term above it, here and now without an election, else by standing down (fenced) so the
        next election's INCR lands above it; our writes meanwhile are fenced. docs/replication.md."""
        # Checked before the epoch is believed: a malformed registration or heartbeat must not move it.
        if broker_id < 0:
            raise InvalidRequest(f"broker_id must be >= 0, got {broker_id}")
        if seen > MAX_CONTROLLER_EPOCH:
            raise InvalidRequest(f"controller_epoch {seen} was never issued (at most {MAX_CONTROLLER_EPOCH})")
        if seen <= self._epoch:
            return
        async with self._lock:
            if seen <= self._epoch or self._fenced_by is not None:
                fenced = self._fenced_by
            else:
                log.error(
                    "broker %d has obeyed controller epoch %d, above this coordinator's %d: the metadata "
                    "store lost its epoch; taking a new term above it",
                    broker_id,
                    seen,
                    self._epoch,
                )
                await self._store.raise_epoch(seen)
                fenced = self._fenced_by = (
                    f"coordinator epoch {self._epoch} is older than epoch {seen} a broker has obeyed: "
                    "a new term is being taken"
                )
                if self.election is not None:
                    self.election.fenced()
        if fenced is None:
            return
        if self.election is None:
            await self.start()  # the next epoch (INCR) is above ``seen``
            return
        raise NotCoordinator(fenced)

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

    # ---- idempotent producers --------------------------------------------------------------------------

    async def init_producer_id(self, client_id: str, current: ProducerIdentity | None) -> ProducerIdentity:
        """A producer id and epoch (producer_ids.py): new, or ``current``'s id under the next epoch."""
        self._check_leader()
        return await init_producer_id(
            self._producer_blocks, self._producer_quota, self._epoch, client_id, current, self._clock.now_ms()
        )

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
        # A join creating a group takes a token of its principal's group-creation quota (limits.py).
        creating = request.member_epoch == JOIN_EPOCH and group not in self.groups.groups
        who = mutation_key() if creating else None
        if creating:
            self._group_creation_quota().check(who, self._clock.now_ms(), f"create group {group!r}", "groups")
        response = await self._write(
            lambda now: self.groups.heartbeat(request, now, new_id),
            requester=lambda response: (group, response.member_id),
        )
        if creating and group in self.groups.groups:
            self._group_creation_quota().record(who, 1, self._clock.now_ms())
        return response

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
        # Fresh high watermarks (max age 0: an operator expects what was just produced), through the
        # shared cache, so the next lag refresh need not ask again.
        rows = await self._lag.rows(self.cluster, description, group, self._fresh_log_end)
        if description is None and not any(r.committed >= 0 for r in rows):
            raise UnknownGroup(f"group {group!r} does not exist (no members, no committed offsets)")
        if description is not None:
            description = await self._lag.with_handovers(group, description)
        self._asked[group] = time.monotonic()  # its lag is refreshed for a while (timers.py)
        lagging = lag_positions(rows)
        stamps = await self._lag.record_timestamps(self.cluster, lagging) if lagging else {}
        now_ms = self._clock.now_ms()
        return description, rows, [time_lag(r, stamps, now_ms) for r in rows]

    async def _fresh_log_end(
        self, cluster: ClusterState, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        return await self._log_end.get(cluster, partitions, max_age_s=0.0)

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
        self._asked.pop(group, None)
        log.info("group %s deleted: %d keys, %d committed offsets", group, len(found.keys), deleted)
        return deleted
