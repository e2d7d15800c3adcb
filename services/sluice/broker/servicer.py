"""The Broker gRPC servicer: protobuf <-> domain objects, and nothing else.

Routing, validation and errors are the service's (``sluice.broker.service``); a raised
``SluiceError`` becomes a gRPC status in the shared interceptor. The ``*_from_proto``
converters are also used by the coordinator link for heartbeat-carried updates.
"""

from __future__ import annotations

from sluice.broker.assignment import AssignmentUpdate, PartitionAssignment, TopicOverrides
from sluice.broker.fetch import PartitionRead, PartitionSpec
from sluice.broker.service import BrokerService, FetchOutcome, FetchParams, OffsetQuery, ProduceItem
from sluice.errors import SluiceError
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


def fetch_response_to_proto(outcome: FetchOutcome) -> broker_pb2.FetchResponse:
    return broker_pb2.FetchResponse(
        error=_error(outcome.error),
        session_id=outcome.session_id,
        partitions=[_partition_response(p) for p in outcome.partitions],
    )


class BrokerServicer(broker_pb2_grpc.BrokerServicer):
    def __init__(self, service: BrokerService) -> None:
        self.service = service

    async def Produce(
        self, request: broker_pb2.ProduceRequest, context: object
    ) -> broker_pb2.ProduceResponse:
        items = [ProduceItem(p.topic, p.partition, p.records) for p in request.partitions]
        results = await self.service.produce(request.acks, request.timeout_ms, items)
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
            ]
        )

    async def Fetch(self, request: broker_pb2.FetchRequest, context: object) -> broker_pb2.FetchResponse:
        outcome = await self.service.fetch(fetch_params_from_proto(request))
        return fetch_response_to_proto(outcome)

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
