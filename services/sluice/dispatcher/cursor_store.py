"""Durable cursors in the offset store: load one, save many in batches.

Writes are batched: the service marks cursors dirty as acks arrive, and :meth:`CursorStore.flush`
(every ``cursor_flush_interval``, and once more on a graceful stop) sends every dirty cursor in as few
``SaveCursors`` calls as the offset store's limits allow. A cursor is converted to its protobuf form
synchronously inside the flush (no copy of its ranges is kept), so a 500,000-range cursor costs its
8 MB array plus, briefly, the request's own buffer.

Crash counts: a cursor carries its write-ahead ``delivered_up_to`` mark and its range counts
(``cursor.py``). :meth:`CursorStore.load` hands the dispatcher a cursor that already counts,
once more, everything the previous owner may have delivered and not seen acknowledged, and that
lets nothing go out before those counts are persisted.

Leader epochs: a cursor is saved with the leader epoch of the record below its position
(``PartitionCursor.epoch_to_save``) and loaded with it; ``epoch_check.check_loaded`` checks it against
the partition's current leader before the subscription serves it (KIP-320).

Fencing: each cursor carries ``owner_epoch`` = this dispatcher's registration epoch. The offset store
refuses (``FENCED_MEMBER_EPOCH``) a write older than the stored epoch: another dispatcher owns the
partition now, and this one must stop serving it. Each cursor also carries the ``topic_id`` of the topic
incarnation it was read from: once the topic is deleted (or deleted and re-created) the store refuses it
(``UNKNOWN_TOPIC_ID``), so an old position never lands in a new topic; such cursors are returned like
fenced ones, and the subscription is unloaded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from sluice.common.log_limit import RateLimitedWarning
from sluice.common.rpc import error_from_rpc
from sluice.dispatcher.cursor import PartitionCursor
from sluice.errors import (
    FencedMemberEpoch,
    SluiceError,
    StorageError,
    UnknownTopicId,
    UnknownTopicOrPartition,
    error_from_proto,
)
from sluice.v1 import offset_store_pb2, offset_store_pb2_grpc

log = logging.getLogger(__name__)

__all__ = ["CursorKey", "CursorStore", "DirtyCursor"]

MAX_CURSORS_PER_SAVE = 1000
MAX_RANGE_VALUES_PER_SAVE = 4_000_000
RPC_TIMEOUT = 10.0

CursorKey = tuple[str, str, int]  # (topic, subscription, partition)
#: Refusals that mean "stop serving this subscription": another owner, or another topic incarnation.
_REFUSED: tuple[type[SluiceError], ...] = (FencedMemberEpoch, UnknownTopicId, UnknownTopicOrPartition)


@dataclass(frozen=True, slots=True)
class DirtyCursor:
    topic: str
    subscription: str
    cursor: PartitionCursor
    #: The topic incarnation the cursor belongs to ("": unchecked).
    topic_id: str = ""


class CursorStore:
    """The offset store client for cursors. ``address`` comes from the coordinator's Metadata."""

    def __init__(self, stub_for: Callable[[str], offset_store_pb2_grpc.OffsetStoreAsyncStub]) -> None:
        self._stub_for = stub_for
        self.address = ""
        self.saves = 0
        #: While the offset store (or its Redis) is away, a flush fails every interval: a few warnings
        #: per outage, not one per flush. Its errors are retriable (STORAGE_ERROR, or
        #: COMMIT_OUTCOME_UNKNOWN: the save may have landed; saving again is harmless, the same
        #: cursor under the same epoch), and the next flush retries.
        self._warn = RateLimitedWarning(log, "the offset store")

    def flush_failed(self, cursors: int, error: SluiceError) -> None:
        self._warn.failed(f"saving {cursors} cursors", error)

    def flush_succeeded(self) -> None:
        self._warn.succeeded()

    def _stub(self) -> offset_store_pb2_grpc.OffsetStoreAsyncStub:
        if not self.address:
            raise StorageError(
                "no offset store is known: run `sluice offset-store` and pass the coordinator --offset-store"
            )
        return self._stub_for(self.address)

    async def load(
        self, topic: str, subscription: str, partition: int, log_end: int | None = None
    ) -> PartitionCursor | None:
        """The persisted cursor, or None. ``log_end``: the partition's log end now; the previous
        owner cannot have delivered anything at or above it, so the recovery window stops there
        (records produced after its mark was written are not counted)."""
        try:
            resp = await self._stub().LoadCursor(
                offset_store_pb2.LoadCursorRequest(
                    topic=topic, partition=partition, subscription=subscription
                ),
                timeout=RPC_TIMEOUT,
            )
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        if not resp.found:
            return None
        c = resp.cursor
        cursor = PartitionCursor(
            partition,
            c.mark_delete,
            c.acked_ranges,
            dict(c.redelivery_counts),
            count_ranges=c.redelivery_ranges,
            persisted=True,
            leader_epoch=c.leader_epoch if c.HasField("leader_epoch") else -1,
        )
        mark = c.delivered_up_to if log_end is None else min(c.delivered_up_to, log_end)
        counted = cursor.recover(mark)
        if counted:
            log.info(
                "cursor %s/%s/%d: %d unacknowledged messages below the persisted delivered mark %d may "
                "have been delivered before the last owner stopped; their redelivery counts go up by one",
                topic,
                subscription,
                partition,
                counted,
                c.delivered_up_to,
            )
        return cursor

    async def save(self, dirty: Sequence[DirtyCursor], owner_epoch: int) -> list[DirtyCursor]:
        """Persist ``dirty``; mark each saved one; return those refused for good (another dispatcher
        fenced them off, or their topic incarnation is gone)."""
        fenced: list[DirtyCursor] = []
        i = 0
        while i < len(dirty):
            chunk: list[tuple[DirtyCursor, int, int]] = []
            request = offset_store_pb2.SaveCursorsRequest()
            values = 0
            while i < len(dirty) and len(chunk) < MAX_CURSORS_PER_SAVE:
                d = dirty[i]
                n = len(d.cursor.acked.flat)
                if chunk and values + n > MAX_RANGE_VALUES_PER_SAVE:
                    break
                snap = d.cursor.snapshot()
                request.cursors.append(
                    offset_store_pb2.Cursor(
                        topic=d.topic,
                        partition=snap.partition,
                        subscription=d.subscription,
                        mark_delete=snap.mark_delete,
                        acked_ranges=snap.acked_ranges,
                        redelivery_counts=snap.redelivery_counts,
                        owner_epoch=owner_epoch,
                        topic_id=d.topic_id,
                        delivered_up_to=snap.delivered_up_to,
                        redelivery_ranges=snap.redelivery_ranges,
                        # None: unset, a cursor read in no known epoch (loaded as before, unchecked).
                        leader_epoch=snap.leader_epoch if snap.leader_epoch >= 0 else None,
                    )
                )
                chunk.append((d, snap.version, snap.delivered_up_to))
                values += n
                i += 1
            try:
                resp = await self._stub().SaveCursors(request, timeout=RPC_TIMEOUT)
            except grpc.RpcError as exc:
                raise error_from_rpc(exc) from None
            del request
            self.saves += 1
            for (d, version, mark), answer in zip(chunk, resp.errors, strict=False):
                err = error_from_proto(answer)
                if err is None:
                    d.cursor.mark_saved(version, mark)
                elif isinstance(err, _REFUSED):
                    log.warning(
                        "cursor %s/%s/%d fenced: %s", d.topic, d.subscription, d.cursor.partition, err.message
                    )
                    fenced.append(d)
                else:
                    log.warning(
                        "cursor %s/%s/%d not saved: %s",
                        d.topic,
                        d.subscription,
                        d.cursor.partition,
                        err.message,
                    )
        return fenced
