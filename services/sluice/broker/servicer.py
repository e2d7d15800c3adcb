"""The Broker gRPC servicer: a transport adapter, protobuf <-> core calls, and nothing else.

Routing, validation, authorization and errors are the core's (``sluice.broker.service``); a
raised ``SluiceError`` becomes a gRPC status in the shared interceptor. Every call passes the
caller's ``RequestContext`` (:meth:`BrokerServicer.context`, the authentication seam). The
``*_from_proto`` converters are also used by the coordinator link for heartbeat-carried updates.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment, TopicOverrides
from sluice.broker.handlers import (
    AppendedProduce,
    RequestHandlers,
    error_to_proto,
    fetch_params_from_proto,
    fetch_response_to_proto,
    produce_bytes,
    produce_items,
    produce_response_to_proto,
)
from sluice.broker.requests import EpochQuery, OffsetQuery
from sluice.broker.service import BrokerService
from sluice.quotas.broker_hooks import fetch_amounts, is_replica, produce_amounts
from sluice.quotas.client_id import with_client_id
from sluice.quotas.throttle import FETCH, PRODUCE, quotas_hold, throttle_ms
from sluice.security.context import RequestContext, current
from sluice.server.wire import MAX_BACKLOG
from sluice.v1 import broker_pb2, broker_pb2_grpc


def overrides_from_proto(config: broker_pb2.TopicConfig) -> TopicOverrides:
    return TopicOverrides(
        retention_ms=config.retention_ms,
        retention_bytes=config.retention_bytes,
        segment_bytes=config.segment_bytes,
        segment_ms=config.segment_ms,
        max_batch_bytes=config.max_batch_bytes,
    )


def _assignment(a: broker_pb2.PartitionAssignment) -> PartitionAssignment:
    # No replicas: a sender from before replication (or a standalone one); the receiving broker leads.
    return PartitionAssignment(
        a.topic,
        a.topic_id,
        a.partition,
        overrides_from_proto(a.config),
        leader=a.leader if a.replicas else None,
        leader_epoch=a.leader_epoch,
        partition_epoch=a.partition_epoch,
        replicas=tuple(a.replicas),
        isr=tuple(a.isr),
        min_insync_replicas=a.min_insync_replicas or 1,
        throttle_bytes_per_second=max(0, a.throttle_bytes_per_second),
    )


def update_from_proto(req: broker_pb2.UpdatePartitionsRequest) -> AssignmentUpdate:
    return AssignmentUpdate(
        metadata_version=req.metadata_version,
        full=req.full,
        assign=tuple(_assignment(a) for a in req.assign),
        remove=tuple(_assignment(a) for a in req.remove),
        controller_epoch=req.controller_epoch,
    )


#: Every gRPC caller today (the interceptor authenticates but names no principal yet).
class BrokerServicer(broker_pb2_grpc.BrokerServicer):
    def __init__(self, service: BrokerService, handlers: RequestHandlers | None = None) -> None:
        self.service = service
        self.handlers = handlers or RequestHandlers(service)

    def context(self, context: object) -> RequestContext:
        """The caller of one call or stream: the context the interceptor built after authenticating
        it (``sluice.security.context.current``), with the client id it announces (quotas)."""
        return with_client_id(current(), context)

    async def Produce(
        self, request: broker_pb2.ProduceRequest, context: object
    ) -> broker_pb2.ProduceResponse:
        ctx = self.context(context)
        quotas = self.handlers.quotas
        await quotas_hold(quotas, ctx, PRODUCE)  # a throttled caller's next request waits (KIP-219)
        throttle = throttle_ms(quotas.record(ctx, produce_amounts(request)))
        # The produce memory pool (docs/memory.md): this request holds its bytes until answered.
        pool, held = self.service.memory.produce, produce_bytes(request)
        if not pool.try_take(held):
            await pool.take(held)
        try:
            results = await self.service.produce(
                request.acks, request.timeout_ms, produce_items(request), ctx
            )
        finally:
            pool.release(held)
        answer = produce_response_to_proto(results, request.request_id)
        answer.throttle_time_ms = throttle
        return answer

    async def Fetch(self, request: broker_pb2.FetchRequest, context: object) -> broker_pb2.FetchResponse:
        ctx = self.context(context)
        quotas = self.handlers.quotas
        metered = not is_replica(request)
        if metered:
            await quotas_hold(quotas, ctx, FETCH, request.client_id)
        outcome = await self.service.fetch(fetch_params_from_proto(request), ctx)
        try:
            answer = fetch_response_to_proto(outcome, request.request_id)
        finally:
            self.service.memory.fetch.release(outcome.held_bytes)
        if metered:
            answer.throttle_time_ms = throttle_ms(
                quotas.record(ctx, fetch_amounts(answer), request.client_id)
            )
        return answer

    async def ProduceStream(
        self, request_iterator: AsyncIterator[broker_pb2.ProduceRequest], context: object
    ) -> AsyncIterator[broker_pb2.ProduceResponse]:
        """Appends each request as soon as it is read (stream order is append order) and answers
        in that order, once each is durable when answers wait for an fsync (flush=always)."""
        handlers = self.handlers
        ctx = self.context(context)
        if handlers.answers_wait_for_fsync:
            async for answer in self._produce_pipelined(request_iterator, ctx):
                yield answer
            return
        # Nothing to wait for: answer each request as it is appended, with no task or queue
        # between reading and writing (a stream message's cost is the latency budget here).
        async for request in request_iterator:
            yield handlers.produce_answer(await self._append_stream_request(request, ctx))

    async def _append_stream_request(
        self, request: broker_pb2.ProduceRequest, ctx: RequestContext
    ) -> AppendedProduce:
        """Append one ProduceStream message. The stream is not read on meanwhile while its caller is
        throttled (a quota, KIP-219) or the produce memory pool is full (docs/memory.md): gRPC's
        stream flow control then stops the client. The request's bytes are held until appended."""
        await quotas_hold(self.handlers.quotas, ctx, PRODUCE)
        pool, held = self.service.memory.produce, produce_bytes(request)
        if not pool.try_take(held):
            await pool.take(held)
        try:
            return self.handlers.append(request, ctx)
        finally:
            pool.release(held)

    async def _produce_pipelined(
        self, request_iterator: AsyncIterator[broker_pb2.ProduceRequest], ctx: RequestContext
    ) -> AsyncIterator[broker_pb2.ProduceResponse]:
        """A reader task keeps appending while earlier requests await their fsync, so one group
        commit releases every request in flight on the stream."""
        handlers = self.handlers
        # Bounded: a client pipelining without limit waits here, not in the broker's memory.
        appended: asyncio.Queue[AppendedProduce | None] = asyncio.Queue(MAX_BACKLOG)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await appended.put(await self._append_stream_request(request, ctx))
            finally:
                await appended.put(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await appended.get()) is not None:
                await handlers.wait_durable(item)
                yield handlers.produce_answer(item)
            await reader  # the transport's error, if the stream ended with one
        finally:
            reader.cancel()

    async def FetchStream(
        self, request_iterator: AsyncIterator[broker_pb2.FetchRequest], context: object
    ) -> AsyncIterator[broker_pb2.FetchResponse]:
        """One fetch at a time per stream, answered in order (a client wanting several
        fetches in flight to one broker opens several streams)."""
        ctx = self.context(context)
        async for request in request_iterator:
            answer, _ = await self.handlers.fetch(request, ctx)  # gRPC cannot follow: no plan
            yield answer

    async def ListOffsets(
        self, request: broker_pb2.ListOffsetsRequest, context: object
    ) -> broker_pb2.ListOffsetsResponse:
        answers = self.service.list_offsets(
            (OffsetQuery(p.topic, p.partition, p.timestamp) for p in request.partitions),
            self.context(context),
        )
        return broker_pb2.ListOffsetsResponse(
            partitions=[
                broker_pb2.ListOffsetsPartitionResponse(
                    topic=a.topic,
                    partition=a.partition,
                    error=error_to_proto(a.error),
                    offset=a.offset,
                    timestamp=a.timestamp,
                )
                for a in answers
            ]
        )

    async def OffsetForLeaderEpoch(
        self, request: broker_pb2.OffsetForLeaderEpochRequest, context: object
    ) -> broker_pb2.OffsetForLeaderEpochResponse:
        answers = self.service.offset_for_leader_epoch(
            [
                EpochQuery(p.topic, p.partition, p.leader_epoch, p.current_leader_epoch)
                for p in request.partitions
            ],
            self.context(context),
        )
        return broker_pb2.OffsetForLeaderEpochResponse(
            partitions=[
                broker_pb2.OffsetForLeaderEpochPartitionResponse(
                    topic=a.topic,
                    partition=a.partition,
                    error=error_to_proto(a.error),
                    leader_epoch=a.leader_epoch,
                    end_offset=a.end_offset,
                )
                for a in answers
            ]
        )

    async def UpdatePartitions(
        self, request: broker_pb2.UpdatePartitionsRequest, context: object
    ) -> broker_pb2.UpdatePartitionsResponse:
        await self.service.update_partitions(update_from_proto(request), self.context(context))
        return broker_pb2.UpdatePartitionsResponse()
