"""The offset store's service layer: validation, routing to storage, error mapping, metrics.

It speaks domain objects (model.py) only; the servicer translates protobuf.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from sluice.common.names import validate_topic
from sluice.errors import FencedMemberEpoch, InvalidArgument, SluiceError, StorageError
from sluice.offsetstore import validation
from sluice.offsetstore.cursor_codec import CursorCodecError, CursorState, decode_cursor, encode_cursor
from sluice.offsetstore.metrics import OffsetStoreMetrics, offset_store_metrics
from sluice.offsetstore.model import (
    CommitOutcome,
    CursorKey,
    CursorWrite,
    MessageModel,
    OffsetCommit,
    ResetOutcome,
    ResetRequest,
    StoredCursor,
    TopicPartition,
)
from sluice.offsetstore.reset import OffsetResolver, run_reset
from sluice.offsetstore.storage import FetchedOffsets, PositionStore
from sluice.offsetstore.subscriptions import SubscriptionRecord
from sluice.offsetstore.topic_identity import TopicRefusal, topic_error

log = logging.getLogger(__name__)

T = TypeVar("T")

# Encoding or decoding this many range values takes tens of milliseconds: do it
# in a worker thread so other RPCs (commits) keep flowing meanwhile.
_OFFLOAD_VALUES = 50_000


class OffsetStoreService:
    def __init__(
        self,
        store: PositionStore,
        resolver: OffsetResolver | None = None,
        metrics: OffsetStoreMetrics | None = None,
    ) -> None:
        self._store = store
        self._resolver = resolver
        self._metrics = metrics or offset_store_metrics()

    async def close(self) -> None:
        if self._resolver is not None:
            await self._resolver.close()
        await self._store.close()

    # ---- group offsets ---------------------------------------------------------

    async def commit(
        self,
        group: str,
        member_id: str,
        member_epoch: int,
        commits: Sequence[OffsetCommit],
        model: MessageModel = MessageModel.CLUSTERING,
    ) -> list[CommitOutcome]:
        """Commit offsets; one outcome per entry (refusals are per partition)."""
        validation.validate_commit(group, member_id, member_epoch, commits)
        outcomes = await self._store.commit(group, member_id, member_epoch, commits, model)
        for commit, outcome in zip(commits, outcomes, strict=True):
            code = outcome.error.code_name if outcome.error else "NONE"
            self._metrics.commits.labels(code).inc()
            if outcome.error is None and model is MessageModel.CLUSTERING:
                self._metrics.committed(
                    group, commit.track, commit.topic, commit.partition, member_id, outcome.offset
                )
        return outcomes

    async def fetch(
        self,
        group: str,
        track: str,
        partitions: Sequence[TopicPartition] = (),
        member_id: str = "",
    ) -> FetchedOffsets:
        """Committed offsets (-1 for a listed partition that has none) and their topics' current ids."""
        validation.validate_fetch(group, track, partitions, member_id)
        found = await self._store.fetch(group, validation.track_name(track), partitions, member_id)
        offsets = dict(sorted(found.offsets.items(), key=lambda kv: (kv[0].topic, kv[0].partition)))
        return FetchedOffsets(offsets, found.topic_ids, found.leader_epochs)

    async def reset(self, request: ResetRequest) -> list[ResetOutcome]:
        """Set offsets exactly (reset.py); only while the group has no live members."""
        try:
            validation.validate_reset(request)
            track = validation.track_name(request.track)
            outcomes = await run_reset(self._store, self._resolver, request, track)
        except SluiceError as err:
            self._metrics.resets.labels(err.code_name).inc()
            raise
        if request.dry_run:
            return outcomes
        self._metrics.resets.labels("NONE").inc()
        for o in outcomes:
            self._metrics.committed_offset.labels(request.group, track, o.topic, o.partition).set(o.offset)
        log.info(
            "reset offsets of group %s track %s: %s",
            request.group,
            track,
            {f"{o.topic}/{o.partition}": o.offset for o in outcomes},
        )
        return outcomes

    # ---- cursors ---------------------------------------------------------------

    async def save_cursors(self, writes: Sequence[CursorWrite]) -> list[SluiceError | None]:
        """Persist a batch of cursors; per cursor None or the fencing error."""
        validation.validate_cursor_batch(
            len(writes),
            sum(len(w.state.acked_ranges) for w in writes),
            sum(len(w.state.redelivery_counts) for w in writes),
        )
        for i, w in enumerate(writes):
            validation.validate_cursor_key(w.key, f"cursors[{i}]")
            validation.validate_owner_epoch(w.owner_epoch, f"cursors[{i}] ({w.key})")
            validation.validate_topic_id(w.topic_id, f"cursors[{i}] ({w.key})")
        if not writes:
            return []
        blobs = await self._offload(
            sum(len(w.state.acked_ranges) + len(w.state.redelivery_counts) for w in writes),
            lambda: [_encode(i, w) for i, w in enumerate(writes)],
        )
        fenced_by = await self._store.save_cursors(
            [(w.key, w.owner_epoch, blob, w.topic_id) for w, blob in zip(writes, blobs, strict=True)]
        )
        results: list[SluiceError | None] = []
        for w, blob, stored_epoch in zip(writes, blobs, fenced_by, strict=True):
            if isinstance(stored_epoch, TopicRefusal):
                err = topic_error(stored_epoch, w.key.topic, w.topic_id, f"cursor {w.key}")
                results.append(err)
                self._metrics.cursor_saves.labels(err.code_name).inc()
            elif stored_epoch is None:
                results.append(None)
                self._metrics.cursor_saves.labels("NONE").inc()
                self._metrics.cursor_bytes.observe(len(blob))
                self._metrics.cursor_bytes_written.inc(len(blob))
            else:
                err = FencedMemberEpoch(
                    f"cursor {w.key} is owned by dispatcher epoch {stored_epoch}, newer than this writer's "
                    f"{w.owner_epoch}: the partition moved to another dispatcher; stop serving it",
                    subscription=w.key.subscription,
                    topic=w.key.topic,
                    partition=w.key.partition,
                    owner_epoch=stored_epoch,
                )
                results.append(err)
                self._metrics.cursor_saves.labels(err.code_name).inc()
        return results

    async def load_cursor(self, key: CursorKey) -> StoredCursor | None:
        validation.validate_cursor_key(key, "cursor")
        stored = await self._store.load_cursor(key)
        if stored is None:
            return None
        blob = stored.blob
        try:
            # Loads are rare (a dispatcher starting or taking over) and a small
            # blob may hold a million ranges: always decode off the event loop.
            state = await asyncio.to_thread(decode_cursor, blob)
        except CursorCodecError as exc:
            log.error("stored cursor %s is corrupt: %s", key, exc)
            raise StorageError(f"the stored cursor {key} is corrupt: {exc}") from None
        return StoredCursor(key, stored.owner_epoch, state, len(blob))

    # ---- the subscription registry ---------------------------------------------

    async def touch_subscriptions(self, records: Sequence[SubscriptionRecord]) -> list[SluiceError | None]:
        """Record durable subscriptions; per record None, or why it was not (its topic is gone or another
        incarnation now: a late touch must not bring a deleted topic's subscription back)."""
        for i, r in enumerate(records):
            validation.validate_subscription_record(r, f"subscriptions[{i}]")
        refusals = await self._store.touch_subscriptions(records)
        return [
            None if refusal is None else topic_error(refusal, r.topic, r.topic_id, f"subscription {r.field}")
            for r, refusal in zip(records, refusals, strict=True)
        ]

    async def list_subscriptions(self, topic: str) -> list[SubscriptionRecord]:
        if topic:
            validate_topic(topic)
        return await self._store.list_subscriptions(topic)

    async def delete_subscription(
        self, topic: str, subscription: str, partitions: Sequence[int], unregister: bool
    ) -> int:
        validation.validate_cursor_key(CursorKey(subscription, topic, 0), "subscription")
        for p in partitions:
            validation.validate_partition(p, "partitions")
        removed = await self._store.delete_subscription(topic, subscription, partitions, unregister)
        log.info(
            "deleted subscription state %s/%s partitions %s: %d keys",
            topic,
            subscription,
            partitions,
            removed,
        )
        return removed

    @staticmethod
    async def _offload(work: int, fn: Callable[[], T]) -> T:
        if work < _OFFLOAD_VALUES:
            return fn()
        return await asyncio.to_thread(fn)


def _encode(index: int, write: CursorWrite) -> bytes:
    state: CursorState = write.state
    try:
        return encode_cursor(
            state.mark_delete,
            state.acked_ranges,
            state.redelivery_counts,
            state.delivered_up_to,
            state.redelivery_ranges,
            state.leader_epoch,
        )
    except CursorCodecError as exc:
        raise InvalidArgument(f"cursors[{index}] ({write.key}): {exc}") from None
