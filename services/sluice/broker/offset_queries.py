"""The broker core's offset questions: ListOffsets and OffsetForLeaderEpoch.

A part of ``BrokerService`` (``service.py``, which mixes it in), apart only to keep modules
small. Both answer per partition from the served partition's log, without reading records
(OffsetForLeaderEpoch from the log's leader-epoch cache: docs/replication.md, "Leader epochs in
the log"). Transport-neutral: the gRPC servicer adapts them, and the wire protocol can too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sluice.broker.assignment import PartitionRegistry
from sluice.broker.requests import DEFAULT_CONTEXT, EpochAnswer, EpochQuery, OffsetAnswer, OffsetQuery
from sluice.errors import InvalidArgument, SluiceError, StorageError
from sluice.server.context import Operation, RequestContext

__all__ = ["EARLIEST", "LATEST", "OffsetQueries"]

EARLIEST = -2
LATEST = -1


class OffsetQueries:
    """Mixed into ``BrokerService``, which sets these attributes."""

    registry: PartitionRegistry
    _authorize: Callable[[RequestContext, Operation, str], None]

    def _check_running(self) -> None:
        """Raise BrokerNotAvailable once the broker is stopping (the service's)."""
        raise NotImplementedError

    # ---- ListOffsets -----------------------------------------------------------------

    def list_offsets(
        self, queries: Iterable[OffsetQuery], ctx: RequestContext = DEFAULT_CONTEXT
    ) -> list[OffsetAnswer]:
        self._check_running()
        return [self._list_offset(q, ctx) for q in queries]

    def _list_offset(self, q: OffsetQuery, ctx: RequestContext) -> OffsetAnswer:
        try:
            self._authorize(ctx, Operation.DESCRIBE, q.topic)
            plog = self.registry.lookup(q.topic, q.partition)
            if q.timestamp == EARLIEST:
                return OffsetAnswer(q.topic, q.partition, None, plog.log_start_offset)
            if q.timestamp == LATEST:
                return OffsetAnswer(q.topic, q.partition, None, plog.log_end_offset)
            if q.timestamp < 0:
                raise InvalidArgument(
                    f"timestamp must be -2 (earliest), -1 (latest) or >= 0, got {q.timestamp}"
                )
            found = plog.offset_for_timestamp(q.timestamp)
            if found is None:
                return OffsetAnswer(q.topic, q.partition, None, plog.log_end_offset)
            return OffsetAnswer(q.topic, q.partition, None, found[0], found[1])
        except SluiceError as err:
            return OffsetAnswer(q.topic, q.partition, err)
        except OSError as exc:
            return OffsetAnswer(q.topic, q.partition, StorageError(f"offset lookup failed: {exc}"))

    # ---- OffsetForLeaderEpoch ----------------------------------------------------------

    def offset_for_leader_epoch(
        self, queries: Iterable[EpochQuery], ctx: RequestContext = DEFAULT_CONTEXT
    ) -> list[EpochAnswer]:
        """Per partition: the largest leader epoch <= the one asked and where it ends in this log.

        Authorized as CLUSTER_ACTION: only replicas ask it. Errors are per partition
        (NOT_LEADER / UNKNOWN_TOPIC_OR_PARTITION for one this broker does not serve).
        """
        self._check_running()
        return [self._epoch_answer(q, ctx) for q in queries]

    def _epoch_answer(self, q: EpochQuery, ctx: RequestContext) -> EpochAnswer:
        try:
            self._authorize(ctx, Operation.CLUSTER_ACTION, q.topic)
            if q.leader_epoch < -1:
                raise InvalidArgument(f"leader_epoch must be >= -1, got {q.leader_epoch}")
            plog = self.registry.lookup(q.topic, q.partition)
            epoch, end = plog.end_offset_for_epoch(q.leader_epoch)
            return EpochAnswer(q.topic, q.partition, None, epoch, end)
        except SluiceError as err:
            return EpochAnswer(q.topic, q.partition, err)
