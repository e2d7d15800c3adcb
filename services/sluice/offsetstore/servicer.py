"""gRPC servicer: translates between ``sluice.v1`` protobuf and the service layer.

No rules live here.
"""

from __future__ import annotations

from array import array
from typing import Any

from grpc import aio

from sluice.errors import InvalidArgument
from sluice.offsetstore.cursor_codec import CursorState
from sluice.offsetstore.model import (
    CursorKey,
    CursorWrite,
    MessageModel,
    OffsetCommit,
    ResetRequest,
    ResetSpec,
    TopicPartition,
)
from sluice.offsetstore.service import OffsetStoreService
from sluice.offsetstore.subscriptions import SubscriptionRecord
from sluice.offsetstore.validation import track_name
from sluice.security.audit import audit_current
from sluice.v1 import common_pb2, coordinator_pb2, offset_store_pb2, offset_store_pb2_grpc

Context = aio.ServicerContext[Any, Any]

_MODELS: dict[int, MessageModel] = {
    coordinator_pb2.MESSAGE_MODEL_CLUSTERING: MessageModel.CLUSTERING,
    coordinator_pb2.MESSAGE_MODEL_BROADCASTING: MessageModel.BROADCASTING,
}


def message_model(value: int) -> MessageModel:
    model = _MODELS.get(value)
    if model is None:
        raise InvalidArgument(
            f"unknown message model {value}: use MESSAGE_MODEL_CLUSTERING or MESSAGE_MODEL_BROADCASTING"
        )
    return model


def reset_spec(value: int) -> ResetSpec:
    try:
        return ResetSpec(value)
    except ValueError:
        raise InvalidArgument(
            f"unknown reset spec {value}: use RESET_SPEC_OFFSET, _EARLIEST, _LATEST, _TIMESTAMP or _SHIFT"
        ) from None


def cursor_write(cursor: offset_store_pb2.Cursor) -> CursorWrite:
    key = CursorKey(cursor.subscription, cursor.topic, cursor.partition)
    state = CursorState(
        cursor.mark_delete,
        array("q", cursor.acked_ranges),
        dict(cursor.redelivery_counts),
        cursor.delivered_up_to,
        array("q", cursor.redelivery_ranges),
        cursor.leader_epoch if cursor.HasField("leader_epoch") else -1,
    )
    return CursorWrite(key, cursor.owner_epoch, state, cursor.topic_id)


class OffsetStoreServicer(offset_store_pb2_grpc.OffsetStoreServicer):
    def __init__(self, service: OffsetStoreService) -> None:
        self._service = service

    async def CommitOffsets(
        self, request: offset_store_pb2.CommitOffsetsRequest, context: Context
    ) -> offset_store_pb2.CommitOffsetsResponse:
        commits = [
            OffsetCommit(
                o.topic,
                o.partition,
                o.offset,
                o.track or "default",
                o.topic_id,
                o.leader_epoch if o.HasField("leader_epoch") else -1,
            )
            for o in request.offsets
        ]
        outcomes = await self._service.commit(
            request.group,
            request.member_id,
            request.member_epoch,
            commits,
            message_model(request.message_model),
        )
        response = offset_store_pb2.CommitOffsetsResponse()
        for outcome in outcomes:
            result = response.results.add(
                topic=outcome.topic, partition=outcome.partition, offset=outcome.offset
            )
            if outcome.error is not None:
                result.error.CopyFrom(outcome.error.to_proto())
        return response

    async def FetchOffsets(
        self, request: offset_store_pb2.FetchOffsetsRequest, context: Context
    ) -> offset_store_pb2.FetchOffsetsResponse:
        partitions = [TopicPartition(tp.topic, tp.partition) for tp in request.partitions]
        found = await self._service.fetch(request.group, request.track, partitions, request.member_id)
        track = track_name(request.track)
        return offset_store_pb2.FetchOffsetsResponse(
            offsets=[
                offset_store_pb2.PartitionOffset(
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=off,
                    track=track,
                    topic_id=found.topic_ids.get(tp.topic, ""),
                    leader_epoch=found.leader_epochs.get(tp),
                )
                for tp, off in found.offsets.items()
            ]
        )

    async def ResetOffsets(
        self, request: offset_store_pb2.ResetOffsetsRequest, context: Context
    ) -> offset_store_pb2.ResetOffsetsResponse:
        targets = [(t.topic, tuple(t.partitions)) for t in request.topics]
        if request.topic:
            targets.insert(0, (request.topic, tuple(request.partitions)))
        reset = ResetRequest(
            group=request.group,
            targets=tuple(targets),
            spec=reset_spec(request.spec),
            value=request.value,
            track=request.track,
            all_topics=request.all_topics,
            dry_run=request.dry_run,
        )
        outcomes = await self._service.reset(reset)
        if not request.dry_run:
            detail = {"group": request.group, "topics": [t for t, _ in targets], "spec": reset.spec.name}
            audit_current("offsets.reset", detail)
        track = track_name(request.track)
        return offset_store_pb2.ResetOffsetsResponse(
            offsets=[
                offset_store_pb2.PartitionOffset(
                    topic=o.topic, partition=o.partition, offset=o.offset, track=track
                )
                for o in outcomes
            ],
            outcomes=[
                offset_store_pb2.ResetOutcome(
                    topic=o.topic,
                    partition=o.partition,
                    previous=o.previous,
                    offset=o.offset,
                    clamped=o.clamped,
                    log_start_offset=o.log_start_offset,
                    log_end_offset=o.log_end_offset,
                )
                for o in outcomes
            ],
        )

    async def SaveCursors(
        self, request: offset_store_pb2.SaveCursorsRequest, context: Context
    ) -> offset_store_pb2.SaveCursorsResponse:
        errors = await self._service.save_cursors([cursor_write(c) for c in request.cursors])
        # One Error per cursor, in request order; code NONE when it was saved.
        return offset_store_pb2.SaveCursorsResponse(
            errors=[e.to_proto() if e is not None else common_pb2.Error() for e in errors]
        )

    async def LoadCursor(
        self, request: offset_store_pb2.LoadCursorRequest, context: Context
    ) -> offset_store_pb2.LoadCursorResponse:
        stored = await self._service.load_cursor(
            CursorKey(request.subscription, request.topic, request.partition)
        )
        if stored is None:
            return offset_store_pb2.LoadCursorResponse(found=False)
        state = stored.state
        cursor = offset_store_pb2.Cursor(
            topic=stored.key.topic,
            partition=stored.key.partition,
            subscription=stored.key.subscription,
            mark_delete=state.mark_delete,
            owner_epoch=stored.owner_epoch,
            redelivery_counts=state.redelivery_counts,
            delivered_up_to=state.delivered_up_to,
            redelivery_ranges=state.redelivery_ranges,
        )
        if state.leader_epoch >= 0:
            cursor.leader_epoch = state.leader_epoch
        cursor.acked_ranges.extend(state.acked_ranges)
        return offset_store_pb2.LoadCursorResponse(found=True, cursor=cursor)

    # ---- the subscription registry ---------------------------------------------

    async def TouchSubscriptions(
        self, request: offset_store_pb2.TouchSubscriptionsRequest, context: Context
    ) -> offset_store_pb2.TouchSubscriptionsResponse:
        errors = await self._service.touch_subscriptions(
            [
                SubscriptionRecord(
                    s.topic, s.subscription, s.type, s.filter, s.created_ms, s.last_active_ms, s.topic_id
                )
                for s in request.subscriptions
            ]
        )
        return offset_store_pb2.TouchSubscriptionsResponse(
            errors=[e.to_proto() if e is not None else common_pb2.Error() for e in errors]
        )

    async def ListStoredSubscriptions(
        self, request: offset_store_pb2.ListStoredSubscriptionsRequest, context: Context
    ) -> offset_store_pb2.ListStoredSubscriptionsResponse:
        records = await self._service.list_subscriptions(request.topic)
        return offset_store_pb2.ListStoredSubscriptionsResponse(
            subscriptions=[
                offset_store_pb2.StoredSubscription(
                    topic=r.topic,
                    subscription=r.subscription,
                    type=r.type,
                    filter=r.filter,
                    created_ms=r.created_ms,
                    last_active_ms=r.last_active_ms,
                )
                for r in records
            ]
        )

    async def DeleteSubscriptionState(
        self, request: offset_store_pb2.DeleteSubscriptionStateRequest, context: Context
    ) -> offset_store_pb2.DeleteSubscriptionStateResponse:
        removed = await self._service.delete_subscription(
            request.topic, request.subscription, list(request.partitions), request.unregister
        )
        return offset_store_pb2.DeleteSubscriptionStateResponse(deleted_keys=removed)
