"""The Broker gRPC servicer: protobuf <-> domain objects, and nothing else.

Routing, validation and errors are the service's (``sluice.broker.service``); a raised
``SluiceError`` becomes a gRPC status in the shared interceptor. The ``*_from_proto``
converters are also used by the coordinator link for heartbeat-carried updates.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment, TopicOverrides
from sluice.broker.fetch import PartitionRead, PartitionSpec
from sluice.broker.flusher import FlushPolicy
from sluice.broker.service import (
    BrokerService,
    FetchOutcome,
    FetchParams,
    OffsetQuery,
    ProduceItem,
    ProduceResult,
)
from sluice.errors import SluiceError
from sluice.server.metrics import MethodRecorder
from sluice.v1 import broker_pb2, broker_pb2_grpc, common_pb2


def _error(err: SluiceError | None) -> common_pb2.Error | None:
    return None if err is None else err.to_proto()


def overrides_from_proto(config: broker_pb2.TopicConfig) -> TopicOverrides:
    return TopicOverrides(
        retention_ms=config.retention_ms,
        retention_bytes=config.retention_bytes,
        segment_bytes=config.segment_bytes,
        segment_ms=config.segment_ms,
        max_batch_bytes=config.max_batch_bytes,
    )


def _assignment(a: broker_pb2.PartitionAssignment) -> PartitionAssignment:
    return PartitionAssignment(a.topic, a.topic_id, a.partition, overrides_from_proto(a.config))


def update_from_proto(req: broker_pb2.UpdatePartitionsRequest) -> AssignmentUpdate:
    return AssignmentUpdate(
        metadata_version=req.metadata_version,
        full=req.full,
        assign=tuple(_assignment(a) for a in req.assign),
        remove=tuple(_assignment(a) for a in req.remove),
    )


def fetch_params_from_proto(req: broker_pb2.FetchRequest) -> FetchParams:
    return FetchParams(
        max_wait_ms=req.max_wait_ms,
        min_bytes=req.min_bytes,
        max_bytes=req.max_bytes,
        partitions=[
            PartitionSpec(p.topic, p.partition, p.fetch_offset, p.partition_max_bytes, p.filter)
            for p in req.partitions
        ],
        session_id=req.session_id,
        session_epoch=req.session_epoch,
        forgotten=[(tp.topic, tp.partition) for tp in req.forgotten],
    )


def _partition_response(part: PartitionRead) -> broker_pb2.FetchPartitionResponse:
    return broker_pb2.FetchPartitionResponse(
        topic=part.spec.topic,
        partition=part.spec.partition,
        error=_error(part.error),
        high_watermark=part.high_watermark,
        log_start_offset=part.log_start_offset,
        next_offset=part.position,
        records=part.records,
    )


def fetch_response_to_proto(outcome: FetchOutcome, request_id: int) -> broker_pb2.FetchResponse:
    return broker_pb2.FetchResponse(
        error=_error(outcome.error),
        session_id=outcome.session_id,
        partitions=[_partition_response(p) for p in outcome.partitions],
        request_id=request_id,
    )


def _produce_items(request: broker_pb2.ProduceRequest) -> list[ProduceItem]:
    return [ProduceItem(p.topic, p.partition, p.records) for p in request.partitions]


def produce_response_to_proto(results: list[ProduceResult], request_id: int) -> broker_pb2.ProduceResponse:
    return broker_pb2.ProduceResponse(
        partitions=[
            broker_pb2.ProducePartitionResponse(
                topic=r.topic,
                partition=r.partition,
                error=_error(r.error),
                base_offset=r.base_offset,
                log_append_time_ms=r.append_time_ms,
                log_start_offset=r.log_start_offset,
            )
            for r in results
        ],
        request_id=request_id,
    )


# ProduceStream requests appended but not yet answered, per stream.
MAX_STREAM_PIPELINE = 64


@dataclass(slots=True)
class _StreamedProduce:
    """A ProduceStream request already appended, waiting (maybe) for its fsync."""

    request_id: int
    timeout_ms: int
    started: float
    results: list[ProduceResult]
    durable: bool  # the answer waits for wait_durable
    error: SluiceError | None


class BrokerServicer(broker_pb2_grpc.BrokerServicer):
    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self._produce_metrics = MethodRecorder("broker", "Produce")
        self._fetch_metrics = MethodRecorder("broker", "Fetch")

    async def Produce(
        self, request: broker_pb2.ProduceRequest, context: object
    ) -> broker_pb2.ProduceResponse:
        results = await self.service.produce(request.acks, request.timeout_ms, _produce_items(request))
        return produce_response_to_proto(results, request.request_id)

    async def Fetch(self, request: broker_pb2.FetchRequest, context: object) -> broker_pb2.FetchResponse:
        outcome = await self.service.fetch(fetch_params_from_proto(request))
        return fetch_response_to_proto(outcome, request.request_id)

    async def ProduceStream(
        self, request_iterator: AsyncIterator[broker_pb2.ProduceRequest], context: object
    ) -> AsyncIterator[broker_pb2.ProduceResponse]:
        """Appends each request as soon as it is read (stream order is append order) and answers
        in that order, once each is durable when answers wait for an fsync (flush=always)."""
        if self.service.flusher.policy is FlushPolicy.ALWAYS:
            async for answer in self._produce_pipelined(request_iterator):
                yield answer
            return
        # Nothing to wait for: answer each request as it is appended, with no task or queue
        # between reading and writing (a stream message's cost is the latency budget here).
        async for request in request_iterator:
            yield self._produce_answer(self._append(request))

    async def _produce_pipelined(
        self, request_iterator: AsyncIterator[broker_pb2.ProduceRequest]
    ) -> AsyncIterator[broker_pb2.ProduceResponse]:
        """A reader task keeps appending while earlier requests await their fsync, so one group
        commit releases every request in flight on the stream."""
        # Bounded: a client pipelining without limit waits here, not in the broker's memory.
        appended: asyncio.Queue[_StreamedProduce | None] = asyncio.Queue(MAX_STREAM_PIPELINE)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await appended.put(self._append(request))
            finally:
                await appended.put(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await appended.get()) is not None:
                if item.durable:
                    await self.service.wait_durable(item.results, item.timeout_ms)
                yield self._produce_answer(item)
            await reader  # the transport's error, if the stream ended with one
        finally:
            reader.cancel()

    def _append(self, request: broker_pb2.ProduceRequest) -> _StreamedProduce:
        started = time.perf_counter()
        try:
            results, durable = self.service.append(request.acks, request.timeout_ms, _produce_items(request))
        except SluiceError as err:
            return _StreamedProduce(request.request_id, request.timeout_ms, started, [], False, err)
        return _StreamedProduce(request.request_id, request.timeout_ms, started, results, durable, None)

    def _produce_answer(self, item: _StreamedProduce) -> broker_pb2.ProduceResponse:
        if item.error is not None:
            self._produce_metrics.record(item.error.code_name, item.started)
            return broker_pb2.ProduceResponse(error=item.error.to_proto(), request_id=item.request_id)
        self._produce_metrics.record("OK", item.started)
        return produce_response_to_proto(item.results, item.request_id)

    async def FetchStream(
        self, request_iterator: AsyncIterator[broker_pb2.FetchRequest], context: object
    ) -> AsyncIterator[broker_pb2.FetchResponse]:
        """One fetch at a time per stream, answered in order (a client wanting several
        fetches in flight to one broker opens several streams)."""
        async for request in request_iterator:
            started = time.perf_counter()
            try:
                outcome = await self.service.fetch(fetch_params_from_proto(request))
            except SluiceError as err:
                self._fetch_metrics.record(err.code_name, started)
                yield broker_pb2.FetchResponse(error=err.to_proto(), request_id=request.request_id)
                continue
            self._fetch_metrics.record("OK", started)
            yield fetch_response_to_proto(outcome, request.request_id)

    async def ListOffsets(
        self, request: broker_pb2.ListOffsetsRequest, context: object
    ) -> broker_pb2.ListOffsetsResponse:
        answers = self.service.list_offsets(
            OffsetQuery(p.topic, p.partition, p.timestamp) for p in request.partitions
        )
        return broker_pb2.ListOffsetsResponse(
            partitions=[
                broker_pb2.ListOffsetsPartitionResponse(
                    topic=a.topic,
                    partition=a.partition,
                    error=_error(a.error),
                    offset=a.offset,
                    timestamp=a.timestamp,
                )
                for a in answers
            ]
        )

    async def UpdatePartitions(
        self, request: broker_pb2.UpdatePartitionsRequest, context: object
    ) -> broker_pb2.UpdatePartitionsResponse:
        await self.service.update_partitions(update_from_proto(request))
        return broker_pb2.UpdatePartitionsResponse()
