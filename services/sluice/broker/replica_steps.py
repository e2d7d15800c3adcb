"""The broker core's steps that differ for replicated partitions: what an append wakes, what a group
commit may commit, a follower's fetch, and ListOffsets (which answers up to the high watermark).

A part of ``BrokerService`` (``service.py``, which mixes it in), apart to keep modules small.
docs/replication.md, "The data path".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment, PartitionRegistry, UpdatePlan
from sluice.broker.catch_up import latest_not_available
from sluice.broker.fetch import FetchCaps, TopicPartitionKey, validate_limits
from sluice.broker.leading import Leaders, check_epoch
from sluice.broker.longpoll import AppendWaiters
from sluice.broker.replica_fetcher import ReplicaFetchers
from sluice.broker.requests import (
    EpochAnswer,
    EpochQuery,
    FetchParams,
    OffsetAnswer,
    OffsetQuery,
    check_continuous,
)
from sluice.broker.roles import EpochMark
from sluice.errors import InvalidArgument, InvalidRequest, SluiceError, StorageError
from sluice.security.context import ANONYMOUS, GRPC, Operation, RequestContext
from sluice.security.model import Resource, ResourceType

__all__ = ["EARLIEST", "LATEST", "LOG_END", "ReplicaSteps"]

EARLIEST = -2
LATEST = -1
#: The leader's log end offset (above the high watermark while followers catch up): for operators
#: (``sluice topic describe``), never a position a consumer is given.
LOG_END = -3

_DEFAULT_CONTEXT = RequestContext(ANONYMOUS, GRPC)


class ReplicaSteps:
    """Mixed into ``BrokerService``, which sets these attributes."""

    registry: PartitionRegistry
    caps: FetchCaps
    leaders: Leaders
    fetchers: ReplicaFetchers
    waiters: AppendWaiters
    replica_waiters: AppendWaiters
    _authorize: Callable[[RequestContext, Operation, Resource], None]

    def _check_running(self) -> None:
        raise NotImplementedError

    def _reconcile_leaders(self, update: AssignmentUpdate) -> None:
        """After an applied update: leader states for what it assigns, unless an assignment was
        ignored as stale (its epochs are not the ones the registry now holds)."""
        marks = self.registry.epochs.marks

        self.leaders.reconcile(
            (item for item in update.assign if _holds(marks.get(item.key), item)),
            self.registry.served,
        )
        self.fetchers.replan(self.registry.following)

    def _stop_following_deleted(self, plan: UpdatePlan) -> None:
        """Right after an update deleted or replaced logs (before it creates any, in a worker thread while
        the loop serves): no fetcher may append to a deleted log meanwhile. The roles change later, once
        the update's logs exist (``_reconcile_leaders``)."""
        gone = {*plan.delete, *(item.key for item in plan.replace)}
        following = self.registry.following
        if any(key in following for key in gone):
            self.fetchers.replan({key: item for key, item in following.items() if key not in gone})

    def _appended(self, key: TopicPartitionKey) -> None:
        """A served log was appended to: consumers see it now, unless it is replicated; then its
        followers do, and consumers once the HW passes it."""
        state = self.leaders.states.get(key)
        if state is None:
            self.waiters.notify(key)
        else:
            self.replica_waiters.notify(key)
            state.advance()  # an ISR of the leader alone commits at once

    def _flushed(self, keys: Iterable[TopicPartitionKey]) -> None:
        """A group commit fsync'ed these logs: under flush=always the HW may move."""
        states = self.leaders.states
        if states:
            for key in keys:
                state = states.get(key)
                if state is not None:
                    state.advance()

    def _replica_fetch(self, params: FetchParams, ctx: RequestContext) -> RequestContext:
        """Record a follower's positions (its fetch offsets are its log ends); the context its reads
        route with. Positions come from requests only, never from a follow's rounds."""
        if params.replica_id < 0:
            raise InvalidArgument(f"replica_id must be a broker id or -1, got {params.replica_id}")
        if params.session_epoch != -1:
            raise InvalidRequest("a replica fetch is sessionless: set session_epoch to -1")
        if not params.positions_recorded:
            self._record_positions(params)
        return dataclasses.replace(ctx, replica_id=params.replica_id)

    def replica_positions(self, params: FetchParams, ctx: RequestContext) -> FetchParams:
        """A follower's fetch, its positions recorded the moment the transport read it (before the
        fetch is queued and served from a task): the HW advance they allow, the acks=all answers and
        the consumers' wake-ups it completes happen inside that same read callback, not a loop pass
        or more later (docs/replication.md, "Fifth pass"). Positions are what the follower held when
        it sent the request, so recording them before the fetch is served states nothing new. A fetch
        that would be refused is returned as it was: the refusal happens when it is served."""
        if params.replica_id < 0 or params.session_epoch != -1:
            return params
        try:
            self._check_running()
            check_continuous(params, ctx)
            validate_limits(params.max_wait_ms, params.min_bytes, params.max_bytes, self.caps)
        except SluiceError:
            return params
        self._record_positions(params)
        return dataclasses.replace(params, positions_recorded=True)

    def _record_positions(self, params: FetchParams) -> None:
        leaders = self.leaders
        for spec in params.partitions:
            if leaders.error_of(spec.key, params.replica_id, spec.current_leader_epoch) is None:
                leaders.record_fetch(
                    spec.key, params.replica_id, spec.fetch_offset, spec.replica_flushed_offset
                )

    # ---- ListOffsets -----------------------------------------------------------------

    def list_offsets(
        self, queries: Iterable[OffsetQuery], ctx: RequestContext = _DEFAULT_CONTEXT
    ) -> list[OffsetAnswer]:
        self._check_running()
        return [self._list_offset(q, ctx) for q in queries]

    def _list_offset(self, q: OffsetQuery, ctx: RequestContext) -> OffsetAnswer:
        try:
            self._authorize(ctx, Operation.DESCRIBE, Resource(ResourceType.TOPIC, q.topic))
            plog = self.registry.lookup(q.topic, q.partition)
            if q.timestamp == EARLIEST:
                return OffsetAnswer(q.topic, q.partition, None, plog.log_start_offset)
            if q.timestamp == LOG_END:
                return OffsetAnswer(q.topic, q.partition, None, plog.log_end_offset)
            view = self.leaders.views.get((q.topic, q.partition))
            if view is not None and (error := latest_not_available((q.topic, q.partition), view)) is not None:
                raise error  # a new leader catching up: its latest may be below what the old one said
            hw = plog.log_end_offset if view is None else view.high_watermark
            if q.timestamp == LATEST:
                return OffsetAnswer(q.topic, q.partition, None, hw)
            if q.timestamp < 0:
                raise InvalidArgument(
                    f"timestamp must be -3 (log end), -2 (earliest), -1 (latest) or >= 0, got {q.timestamp}"
                )
            found = plog.offset_for_timestamp(q.timestamp)
            if found is None or found[0] >= hw:
                return OffsetAnswer(q.topic, q.partition, None, hw)
            return OffsetAnswer(q.topic, q.partition, None, found[0], found[1])
        except SluiceError as err:
            return OffsetAnswer(q.topic, q.partition, err)
        except OSError as exc:
            return OffsetAnswer(q.topic, q.partition, StorageError(f"offset lookup failed: {exc}"))

    # ---- OffsetForLeaderEpoch --------------------------------------------------------

    def offset_for_leader_epoch(
        self, queries: Iterable[EpochQuery], ctx: RequestContext = _DEFAULT_CONTEXT
    ) -> list[EpochAnswer]:
        """Where each asked epoch ends in this leader's log (KIP-101): a follower's truncation point."""
        self._check_running()
        return [self._epoch_end(q, ctx) for q in queries]

    def _epoch_end(self, q: EpochQuery, ctx: RequestContext) -> EpochAnswer:
        try:
            self._authorize(ctx, Operation.DESCRIBE, Resource(ResourceType.TOPIC, q.topic))
            if q.leader_epoch < -1:
                raise InvalidArgument(f"leader_epoch must be >= -1, got {q.leader_epoch}")
            plog = self.registry.lookup(q.topic, q.partition)
            mark = self.registry.epochs.marks.get((q.topic, q.partition))
            check_epoch(
                (q.topic, q.partition), q.current_leader_epoch, 0 if mark is None else mark.leader_epoch
            )
            epoch, end = plog.end_offset_for_epoch(q.leader_epoch)
            return EpochAnswer(q.topic, q.partition, None, epoch, end)
        except SluiceError as err:
            return EpochAnswer(q.topic, q.partition, err)


def _holds(mark: EpochMark | None, item: PartitionAssignment) -> bool:
    """The registry holds ``item``'s epochs (it was not ignored as stale). The mark's ``replicated``
    flag is not compared: a replicated partition's mark has it set, and the item's epochs are what
    count (comparing whole marks skipped every replicated partition: no leader state, no epoch start
    on a new leader)."""
    if mark is None:
        return False
    return (mark.topic_id, mark.leader_epoch, mark.partition_epoch) == (
        item.topic_id,
        item.leader_epoch,
        item.partition_epoch,
    )
