"""Produce and Fetch as protobuf in, protobuf out, counted per message.

Shared by the transports that carry many requests per connection: the Broker gRPC streams
(``servicer``) and the wire protocol (``wire_server``). Each request's outcome, error
included, becomes its answer, so a bad request never ends the connection it came on. The
unary gRPC methods use the converters only: their metrics come from the interceptor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sluice.broker.fetch import PartitionRead, PartitionSpec
from sluice.broker.flusher import FlushPolicy
from sluice.broker.service import BrokerService, FetchOutcome, FetchParams, ProduceItem, ProduceResult
from sluice.errors import InvalidRequest, SluiceError
from sluice.server.metrics import MethodRecorder
from sluice.v1 import broker_pb2, common_pb2


def error_to_proto(err: SluiceError | None) -> common_pb2.Error | None:
    return None if err is None else err.to_proto()


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
        error=error_to_proto(part.error),
        high_watermark=part.high_watermark,
        log_start_offset=part.log_start_offset,
        next_offset=part.position,
        records=part.records,
    )


def fetch_response_to_proto(outcome: FetchOutcome, request_id: int) -> broker_pb2.FetchResponse:
    return broker_pb2.FetchResponse(
        error=error_to_proto(outcome.error),
        session_id=outcome.session_id,
        partitions=[_partition_response(p) for p in outcome.partitions],
        request_id=request_id,
    )


def check_continuous(request: broker_pb2.FetchRequest, continuous_ok: bool) -> None:
    """Refuse a ``continuous`` fetch where it cannot be served: over gRPC (one answer per request
    there), or with a fetch session (the broker advances the offsets itself)."""
    if not request.continuous:
        return
    if not continuous_ok:
        raise InvalidRequest(
            "FetchRequest.continuous exists only on the wire protocol (docs/wire.md); "
            "over gRPC, send the next fetch after each answer"
        )
    if request.session_epoch != -1:
        raise InvalidRequest("a continuous fetch is sessionless: set session_epoch to -1")
    if request.max_wait_ms <= 0:
        # It would answer again at once, forever: a busy loop on both sides.
        raise InvalidRequest("a continuous fetch needs max_wait_ms > 0")


def produce_items(request: broker_pb2.ProduceRequest) -> list[ProduceItem]:
    return [ProduceItem(p.topic, p.partition, p.records) for p in request.partitions]


def produce_response_to_proto(results: list[ProduceResult], request_id: int) -> broker_pb2.ProduceResponse:
    return broker_pb2.ProduceResponse(
        partitions=[
            broker_pb2.ProducePartitionResponse(
                topic=r.topic,
                partition=r.partition,
                error=error_to_proto(r.error),
                base_offset=r.base_offset,
                log_append_time_ms=r.append_time_ms,
                log_start_offset=r.log_start_offset,
            )
            for r in results
        ],
        request_id=request_id,
    )


@dataclass(slots=True)
class AppendedProduce:
    """A produce request already appended, waiting (maybe) for its fsync before its answer."""

    request_id: int
    timeout_ms: int
    started: float
    results: list[ProduceResult]
    durable: bool  # the answer waits for wait_durable
    error: SluiceError | None


class RequestHandlers:
    """Per-message Produce and Fetch for long-lived connections. One per broker."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self._produce_metrics = MethodRecorder("broker", "Produce")
        self.fetch_metrics = MethodRecorder("broker", "Fetch")

    @property
    def answers_wait_for_fsync(self) -> bool:
        """True under flush=always: answers then wait for the group commit."""
        return self.service.flusher.policy is FlushPolicy.ALWAYS

    def append(self, request: broker_pb2.ProduceRequest) -> AppendedProduce:
        """Append at once (arrival order is append order); the answer may wait for an fsync."""
        started = time.perf_counter()
        try:
            results, durable = self.service.append(request.acks, request.timeout_ms, produce_items(request))
        except SluiceError as err:
            return AppendedProduce(request.request_id, request.timeout_ms, started, [], False, err)
        return AppendedProduce(request.request_id, request.timeout_ms, started, results, durable, None)

    async def wait_durable(self, item: AppendedProduce) -> None:
        if item.durable:
            await self.service.wait_durable(item.results, item.timeout_ms)

    def produce_answer(self, item: AppendedProduce) -> broker_pb2.ProduceResponse:
        if item.error is not None:
            self._produce_metrics.record(item.error.code_name, item.started)
            return broker_pb2.ProduceResponse(error=item.error.to_proto(), request_id=item.request_id)
        self._produce_metrics.record("OK", item.started)
        return produce_response_to_proto(item.results, item.request_id)

    async def fetch(
        self, request: broker_pb2.FetchRequest, continuous_ok: bool = False
    ) -> broker_pb2.FetchResponse:
        """``continuous_ok``: the transport can follow a continuous fetch (the wire protocol)."""
        started = time.perf_counter()
        try:
            check_continuous(request, continuous_ok)
            outcome = await self.service.fetch(fetch_params_from_proto(request))
        except SluiceError as err:
            self.fetch_metrics.record(err.code_name, started)
            return broker_pb2.FetchResponse(error=err.to_proto(), request_id=request.request_id)
        self.fetch_metrics.record("OK", started)
        return fetch_response_to_proto(outcome, request.request_id)
