"""The read steps of the broker core's fetches: route, read, read again when woken, finish.

A part of ``BrokerService`` (``service.py``, which mixes it in), apart only to keep modules
small: these are the steps a long-poll fetch and a follow's rounds share (``follow.FetchCore``),
over the registry of served partitions, the authorizer and the fetch caps. The request-level
rules (limits, sessions, parking) stay in ``service.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

from sluice.broker.assignment import PartitionRegistry
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
from sluice.broker.longpoll import AppendWaiters, StandingWatch
from sluice.broker.metrics import BrokerMetrics
from sluice.broker.sessions import FetchSession
from sluice.errors import SluiceError
from sluice.server.context import Operation, RequestContext

__all__ = ["ReadSteps"]


class ReadSteps:
    """Mixed into ``BrokerService``, which sets these attributes."""

    registry: PartitionRegistry
    caps: FetchCaps
    metrics: BrokerMetrics
    waiters: AppendWaiters
    _authorize: Callable[[RequestContext, Operation, str], None]
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

    def standing_watch(
        self, dirty: set[TopicPartitionKey], keys: Iterable[TopicPartitionKey]
    ) -> StandingWatch:
        """A watch over ``keys`` that marks appended partitions in ``dirty``, until closed."""
        watch = StandingWatch(self.waiters, dirty)
        watch.add(keys)
        return watch

    def read_again(self, read: FetchRead, dirty: Collection[TopicPartitionKey]) -> None:
        """Read the partitions an append (or a serving change) woke a parked read for; a
        partition no longer served here fails with NOT_LEADER."""
        served = self.registry.served
        for part in read.parts:
            if part.key in dirty and part.error is None and served.get(part.key) is not part.log:
                part.fail(self.registry.not_served_error(*part.key))
        read.read(dirty)

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
            self._authorize(ctx, Operation.READ, spec.topic)
        except SluiceError as err:
            return spec, None, err
        plog = self.registry.served.get(spec.key)
        if plog is None:
            return spec, None, self.registry.not_served_error(spec.topic, spec.partition)
        return spec, plog, None
