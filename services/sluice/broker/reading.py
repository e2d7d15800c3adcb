"""The read steps of the broker core's fetches: route, read, read again when woken, finish.

A part of ``BrokerService`` (``service.py``, which mixes it in), apart only to keep modules
small: these are the steps a long-poll fetch and a follow's rounds share (``follow.FetchCore``),
over the registry of served partitions, the authorizer and the fetch caps. The request-level
rules (limits, sessions, parking) stay in ``service.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from sluice.broker.assignment import PartitionRegistry
from sluice.broker.catch_up import above_high_watermark
from sluice.broker.fetch import (
    FetchCaps,
    FetchLimits,
    FetchRead,
    PartitionRead,
    PartitionSpec,
    ReadableLog,
    TopicPartitionKey,
    new_read,
    routed_partition,
)
from sluice.broker.leader_state import HighWatermarkView
from sluice.broker.leading import Leaders, check_epoch
from sluice.broker.log.partition_log import PartitionLog
from sluice.broker.longpoll import AppendWaiters, StandingWatch
from sluice.broker.memory import BrokerMemory
from sluice.broker.metrics import BrokerMetrics
from sluice.broker.sessions import FetchSession
from sluice.errors import SluiceError
from sluice.security.context import Operation, RequestContext
from sluice.security.model import CLUSTER_RESOURCE, Resource, ResourceType

__all__ = ["ReadSteps"]


class ReadSteps:
    """Mixed into ``BrokerService``, which sets these attributes."""

    registry: PartitionRegistry
    caps: FetchCaps
    metrics: BrokerMetrics
    waiters: AppendWaiters
    replica_waiters: AppendWaiters
    leaders: Leaders
    memory: BrokerMemory
    _authorize: Callable[[RequestContext, Operation, Resource], None]
    #: Partitions routed into a fetch read so far: the per-partition work of fetching, which
    #: an idle long-poll over a session or a follow must not do (the smoke test counts it).
    partitions_routed: int = 0

    def _check_running(self) -> None:
        """Raise BrokerNotAvailable once the broker is stopping (the service's)."""
        raise NotImplementedError

    def begin_read(
        self,
        specs: Iterable[PartitionSpec],
        limits: FetchLimits,
        ctx: RequestContext,
        others: int = 0,
    ) -> FetchRead:
        """Route ``specs`` and read what is there now. Raises BrokerNotAvailable when stopping.

        ``others``: partitions of the session or follow left out of ``specs`` as caught up."""
        self._check_running()
        read = new_read((self._route(spec, ctx) for spec in specs), limits, self.caps, others)
        self.partitions_routed += len(read.parts)
        read.read()
        return read

    def read_more(
        self,
        session: FetchSession,
        ctx: RequestContext,
        read: FetchRead,
        dirty: Collection[TopicPartitionKey],
    ) -> None:
        """``read_again`` for a read of a session's (or a follow's) dirty partitions: a woken
        partition the read left out as caught up joins it first."""
        for key in dirty:
            if key not in read.index:
                cached = session.partitions.get(key)
                if cached is None:
                    continue  # forgotten since
                read.add(routed_partition(*self._route(cached.spec, ctx), self.caps))
                self.partitions_routed += 1
        self.read_again(read, dirty)

    def waiters_of(self, ctx: RequestContext) -> AppendWaiters:
        """Where a read parks: a follower's on appends, a consumer's on appends or, for a replicated
        partition, on its HW (docs/replication.md, "High watermark")."""
        return self.waiters if ctx.replica_id < 0 else self.replica_waiters

    def standing_watch(
        self,
        dirty: set[TopicPartitionKey],
        keys: Iterable[TopicPartitionKey],
        ctx: RequestContext | None = None,
    ) -> StandingWatch:
        """A watch over ``keys`` that marks appended partitions in ``dirty``, until closed."""
        watch = StandingWatch(self.waiters if ctx is None else self.waiters_of(ctx), dirty)
        watch.add(keys)
        return watch

    def read_again(self, read: FetchRead, dirty: Collection[TopicPartitionKey]) -> None:
        """Read the partitions an append (or a serving change) woke a parked read for; a
        partition no longer served here fails with NOT_LEADER."""
        served = self.registry.served
        for part in read.parts:
            if part.key in dirty and part.error is None and not _same_log(part.log, served.get(part.key)):
                part.fail(self.registry.not_served_error(*part.key))
        read.read(dirty)

    async def reserved_read(
        self, specs: Iterable[PartitionSpec], limits: FetchLimits, ctx: RequestContext, others: int = 0
    ) -> FetchRead:
        """``begin_read`` within the fetch memory pool (``docs/memory.md``, "Broker"): wait until
        the pool can grant the request's ``max_bytes``, read, then keep only what was read."""
        pool = self.memory.fetch
        if not pool.try_take(limits.max_bytes):
            await pool.take(limits.max_bytes)
        try:
            read = self.begin_read(specs, limits, ctx, others)
        except BaseException:
            pool.release(limits.max_bytes)
            raise
        read.held = limits.max_bytes
        self.settle_held(read)
        return read

    def settle_held(self, read: FetchRead) -> int:
        """Bring the read's share of the fetch pool to the bytes it holds now (a parked read
        woken by appends may have read more); returns them."""
        pool = self.memory.fetch
        now = read.total_bytes
        if now < read.held:
            pool.release(read.held - now)
        else:
            pool.force(now - read.held)
        read.held = now
        return now

    def finish_read(self, read: FetchRead) -> list[PartitionRead]:
        """The read's partitions, marks refreshed, counted in the fetch metrics."""
        parts = read.finish()
        for part in parts:
            if part.batches:
                self.metrics.fetched(part.key[0], part.batches)
        return parts

    def _route(
        self, spec: PartitionSpec, ctx: RequestContext
    ) -> tuple[PartitionSpec, ReadableLog | None, SluiceError | None]:
        try:
            if ctx.replica_id >= 0:  # a follower's fetch: only the cluster replicates
                self._authorize(ctx, Operation.CLUSTER_ACTION, CLUSTER_RESOURCE)
            else:
                self._authorize(ctx, Operation.READ, Resource(ResourceType.TOPIC, spec.topic))
        except SluiceError as err:
            return spec, None, err
        plog = self.registry.served.get(spec.key)
        if plog is None:
            return spec, None, self.registry.not_served_error(spec.topic, spec.partition)
        if ctx.replica_id >= 0:  # a follower reads to the log end
            error = self.leaders.error_of(spec.key, ctx.replica_id, spec.current_leader_epoch)
            return spec, (plog if error is None else None), error
        if spec.current_leader_epoch >= 0:
            mark = self.registry.epochs.marks.get(spec.key)
            try:
                check_epoch(spec.key, spec.current_leader_epoch, 0 if mark is None else mark.leader_epoch)
            except SluiceError as err:
                return spec, None, err
        view = self.leaders.views.get(spec.key)
        if view is None:
            return spec, plog, None
        error = above_high_watermark(spec.key, view, spec.fetch_offset)  # a new leader catching up
        return spec, (view if error is None else None), error


def _same_log(read_log: ReadableLog | None, served: PartitionLog | None) -> bool:
    """The log a read routed to is still the one served (a consumer's may be its HW view)."""
    if served is None:
        return False
    return read_log is served or (isinstance(read_log, HighWatermarkView) and read_log.plog is served)
