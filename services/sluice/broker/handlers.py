"""The broker's transport adapter half both transports share: protobuf <-> core, counted per message.

Translation only: a request becomes the core's domain call (``sluice.broker.service``) with the
caller's ``RequestContext``, and the outcome becomes the answer. Validation, authorization and
errors are the core's; nothing here inspects a request's fields beyond copying them.

Shared by the transports that carry many requests per connection: the Broker gRPC streams
(``servicer``) and the wire protocol (``wire_server``). Each request's outcome, error
included, becomes its answer, so a bad request never ends the connection it came on. The
unary gRPC methods use the converters only: their metrics come from the interceptor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sluice.broker.fetch import PartitionRead, PartitionSpec, TopicPartitionKey
from sluice.broker.follow import ContinuousFetch
from sluice.broker.requests import (
    CONSUMER_REPLICA_ID,
    FetchOutcome,
    FetchParams,
    FollowFrom,
    ProduceItem,
    ProduceResult,
)
from sluice.broker.service import BrokerService
from sluice.errors import SluiceError
from sluice.quotas.broker_hooks import fetch_amounts, is_replica, produce_amounts
from sluice.quotas.follow import FollowThrottle
from sluice.quotas.throttle import FETCH, QuotaManager, quotas_hold, throttle_ms
from sluice.security.context import RequestContext
from sluice.server.metrics import MethodRecorder
from sluice.v1 import broker_pb2, common_pb2


def error_to_proto(err: SluiceError | None) -> common_pb2.Error | None:
    return None if err is None else err.to_proto()


def _spec(p: broker_pb2.FetchPartition) -> PartitionSpec:
    return PartitionSpec(
        p.topic,
        p.partition,
        p.fetch_offset,
        p.partition_max_bytes,
        p.filter,
        p.current_leader_epoch if p.HasField("current_leader_epoch") else -1,
        p.replica_flushed_offset if p.HasField("replica_flushed_offset") else -1,
    )


def fetch_params_from_proto(req: broker_pb2.FetchRequest) -> FetchParams:
    return FetchParams(
        max_wait_ms=req.max_wait_ms,
        min_bytes=req.min_bytes,
        max_bytes=req.max_bytes,
        partitions=[_spec(p) for p in req.partitions],
        session_id=req.session_id,
        session_epoch=req.session_epoch,
        forgotten=[(tp.topic, tp.partition) for tp in req.forgotten],
        continuous=req.continuous,
        replica_id=req.replica_id if req.HasField("replica_id") else CONSUMER_REPLICA_ID,
    )


def _partition_response(part: PartitionRead, records: bool = True) -> broker_pb2.FetchPartitionResponse:
    return broker_pb2.FetchPartitionResponse(
        topic=part.spec.topic,
        partition=part.spec.partition,
        error=error_to_proto(part.error),
        high_watermark=part.high_watermark,
        log_start_offset=part.log_start_offset,
        next_offset=part.position,
        records=part.records if records else b"",
    )


def fetch_response_to_proto(outcome: FetchOutcome, request_id: int) -> broker_pb2.FetchResponse:
    return broker_pb2.FetchResponse(
        error=error_to_proto(outcome.error),
        session_id=outcome.session_id,
        partitions=[_partition_response(p) for p in outcome.partitions],
        request_id=request_id,
    )


class FollowAnswers:
    """Encodes the answers of one followed fetch.

    A follow's rounds after the first carry only the partitions with something new
    (``FetchOutcome.delta``), but the wire protocol's answer names every followed partition, as
    it always has (the dispatcher's feeds and the SDK read each answer whole). So this keeps
    each partition's encoded entry, without records, in answer order, re-encodes only the
    partitions an outcome carries, and joins the rest as they were: an idle round is one join
    of cached bytes. Protobuf parses concatenated encodings as one message (fields in any
    order), so an answer is its header's encoding followed by one entry per partition, and an
    entry with records is its entry without records with the records field appended.
    """

    def __init__(self, request_id: int) -> None:
        self._request_id = request_id
        self._header = broker_pb2.FetchResponse(request_id=request_id).SerializeToString()
        #: Each partition's entry (without records) as the next answer carries it unless an
        #: outcome has news for it; in answer order.
        self._entries: dict[TopicPartitionKey, bytes] = {}

    def encode(self, outcome: FetchOutcome) -> bytes:
        if outcome.error is not None:
            return fetch_response_to_proto(outcome, self._request_id).SerializeToString()
        if not outcome.delta:
            self._entries = {}
        entries = self._entries
        with_records: dict[TopicPartitionKey, list[bytes]] = {}
        for part in outcome.partitions:
            body = _partition_response(part, records=False).SerializeToString()
            entries[part.key] = _field(_PARTITIONS_FIELD, body)
            if part.batches:
                with_records[part.key] = _entry_with_records(body, part.batches)
        parts = [self._header]
        if not with_records:
            parts += entries.values()
        else:  # in answer order (every key is in entries already), the records' entries in place
            for key, entry in entries.items():
                records = with_records.get(key)
                if records is None:
                    parts.append(entry)
                else:
                    parts += records
        # One join, so the batches are copied once on their way into the answer (docs/wire.md,
        # "Receiving a large frame": a join per entry and the header's '+' copied them twice more).
        return b"".join(parts)


_PARTITIONS_FIELD = broker_pb2.FetchResponse.DESCRIPTOR.fields_by_name["partitions"].number
_RECORDS_FIELD = broker_pb2.FetchPartitionResponse.DESCRIPTOR.fields_by_name["records"].number


def _entry_with_records(body: bytes, batches: list[bytes]) -> list[bytes]:
    """A partition's entry as the parts to join into the answer: its body without records, then
    the records field; the batches (most of the answer's bytes while a backlog drains) are not
    copied here, only by the answer's one join."""
    size = sum(len(batch) for batch in batches)
    records_key = _varint(_RECORDS_FIELD << 3 | 2) + _varint(size)
    length = len(body) + len(records_key) + size
    return [_varint(_PARTITIONS_FIELD << 3 | 2) + _varint(length) + body + records_key, *batches]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field: its key, the payload's length, the payload."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def produce_items(request: broker_pb2.ProduceRequest) -> list[ProduceItem]:
    return [ProduceItem(p.topic, p.partition, p.records) for p in request.partitions]


def produce_bytes(request: broker_pb2.ProduceRequest) -> int:
    """What a produce request holds, for the produce memory pool: its record bytes."""
    return sum(len(p.records) for p in request.partitions)


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
    throttle_ms: int = 0  # quotas (docs/quotas.md): carried by the answer


class RequestHandlers:
    """Per-message Produce and Fetch for long-lived connections. One per broker."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self._produce_metrics = MethodRecorder("broker", "Produce")
        self.fetch_metrics = MethodRecorder("broker", "Fetch")
        #: Client quotas (docs/quotas.md); replaced by the broker's quota watcher's manager.
        self.quotas = QuotaManager()

    @property
    def answers_wait_for_fsync(self) -> bool:
        """True under flush=always: answers then wait for the group commit."""
        return self.service.answers_wait_for_fsync

    def append(self, request: broker_pb2.ProduceRequest, ctx: RequestContext) -> AppendedProduce:
        """Append at once (arrival order is append order); the answer may wait for an fsync."""
        started = time.perf_counter()
        # Without quotas (the usual case) not even the request's sizes are summed.
        throttle = (
            throttle_ms(self.quotas.record(ctx, produce_amounts(request)))
            if self.quotas.snapshot.quotas
            else 0
        )
        try:
            results, durable = self.service.append(
                request.acks, request.timeout_ms, produce_items(request), ctx
            )
        except SluiceError as err:
            return AppendedProduce(request.request_id, request.timeout_ms, started, [], False, err, throttle)
        return AppendedProduce(
            request.request_id, request.timeout_ms, started, results, durable, None, throttle
        )

    async def wait_durable(self, item: AppendedProduce) -> None:
        if item.durable:
            await self.service.wait_durable(item.results, item.timeout_ms)

    def produce_answer(self, item: AppendedProduce) -> broker_pb2.ProduceResponse:
        if item.error is not None:
            self._produce_metrics.record(item.error.code_name, item.started)
            return broker_pb2.ProduceResponse(
                error=item.error.to_proto(), request_id=item.request_id, throttle_time_ms=item.throttle_ms
            )
        self._produce_metrics.record("OK", item.started)
        answer = produce_response_to_proto(item.results, item.request_id)
        answer.throttle_time_ms = item.throttle_ms
        return answer

    async def fetch(
        self, request: broker_pb2.FetchRequest, ctx: RequestContext
    ) -> tuple[broker_pb2.FetchResponse, FollowFrom | None]:
        """The answer, and how to follow it when it answers a continuous fetch without error.
        The answer's share of the fetch memory pool is released once it is built (a stream's
        ``yield`` then waits for gRPC to take it)."""
        answer, follow, held = await self.fetch_held(request, ctx)
        self.service.memory.fetch.release(held)
        return answer, follow

    def replica_params(self, request: broker_pb2.FetchRequest, ctx: RequestContext) -> FetchParams | None:
        """A follower's fetch, parsed and its positions recorded as it is read (the wire server
        calls this from its read callback; ``ReplicaSteps.replica_positions``); None for a
        consumer's fetch, parsed when served as before."""
        if not is_replica(request):
            return None
        return self.service.replica_positions(fetch_params_from_proto(request), ctx)

    async def fetch_held(
        self, request: broker_pb2.FetchRequest, ctx: RequestContext, params: FetchParams | None = None
    ) -> tuple[broker_pb2.FetchResponse, FollowFrom | None, int]:
        """As :meth:`fetch`, with the bytes the answer holds in the fetch memory pool, which
        the caller releases once the answer is written (``docs/memory.md``). ``params``: the
        request already parsed (:meth:`replica_params`)."""
        metered = not is_replica(request)
        if metered:  # a throttled caller's next fetch waits (KIP-219)
            await quotas_hold(self.quotas, ctx, FETCH, request.client_id)
        started = time.perf_counter()
        try:
            outcome = await self.service.fetch(params or fetch_params_from_proto(request), ctx)
        except SluiceError as err:
            self.fetch_metrics.record(err.code_name, started)
            return broker_pb2.FetchResponse(error=err.to_proto(), request_id=request.request_id), None, 0
        self.fetch_metrics.record("OK", started)
        answer = fetch_response_to_proto(outcome, request.request_id)
        if metered:
            answer.throttle_time_ms = throttle_ms(
                self.quotas.record(ctx, fetch_amounts(answer), request.client_id)
            )
        return answer, outcome.follow, outcome.held_bytes

    def follow(
        self,
        plan: FollowFrom,
        request_id: int,
        ctx: RequestContext,
        send: Callable[[bytes, bool], None],
        writable: Callable[[], bool],
    ) -> ContinuousFetch:
        """Follow a continuous fetch; each round is one serialized answer to ``send`` (with
        whether it carries records), counted as one Fetch, as each answer of a served fetch is."""
        record = self.fetch_metrics.record
        answers = FollowAnswers(request_id)
        quota = FollowThrottle(self.quotas, ctx, plan.replica_id == CONSUMER_REPLICA_ID)

        def deliver(outcome: FetchOutcome, started: float) -> None:
            record("OK" if outcome.error is None else outcome.error.code_name, started)
            # ``batches``, not ``records``: the latter joins them, a copy just to test for any.
            size = sum(len(batch) for part in outcome.partitions for batch in part.batches)
            send(quota.stamp(answers.encode(outcome), size), size > 0)

        following = self.service.follow(plan, ctx, deliver, lambda: quota.writable(writable))
        quota.resume = following.resume
        return following
