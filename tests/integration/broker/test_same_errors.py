"""One core under both transports: the same bad request gets the same typed error over each.

Every request below is sent, unchanged, as a unary gRPC call, on a gRPC stream
(``ProduceStream``/``FetchStream``) and as a wire-protocol frame to one real broker. Each must
come back with the same error code and message, at the same level (the request's, or one
partition's): validation lives in the broker core (``docs/architecture.md``), so no transport
can accept, refuse or word a request differently.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from sluice.common.wire import FrameType
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2
from tests.batch_v1 import to_v1
from tests.wire_client import RawWire

from .conftest import Broker, make_batch, part, rpc_error, vals

#: (code, message) of an answer's errors: the request's, then each partition's in order.
Errors = tuple[tuple[int, str], list[tuple[int, str]]]

_NONE = (common_pb2.NONE, "")


def _err(e: common_pb2.Error) -> tuple[int, str]:
    return (e.code, e.message)


def _errors(answer: pb.ProduceResponse | pb.FetchResponse) -> Errors:
    return _err(answer.error), [_err(p.error) for p in answer.partitions]


@pytest.fixture
def wire(broker: Broker) -> Iterator[RawWire]:
    conn = RawWire(broker.wire_address)
    assert not conn.hello().error.code
    yield conn
    conn.close()


def _unary(call: grpc.UnaryUnaryMultiCallable[Any, Any], request: object) -> Errors:
    """A request-level error is the call's status (the interceptor's mapping of the same error)."""
    try:
        answer = call(request, timeout=10)
    except grpc.RpcError as exc:
        err = rpc_error(exc)
        return (err.code, err.message), []
    return _errors(answer)


def _produce(topic: str, partition: int, records: bytes, acks: int = 1) -> pb.ProduceRequest:
    request = pb.ProduceRequest(acks=acks, timeout_ms=5000, request_id=7)
    request.partitions.add(topic=topic, partition=partition, records=records)
    return request


def _fetch(*parts: pb.FetchPartition, **fields: int) -> pb.FetchRequest:
    request = pb.FetchRequest(max_wait_ms=0, min_bytes=1, request_id=7, session_epoch=-1)
    for name, value in fields.items():
        setattr(request, name, value)
    request.partitions.extend(parts)
    return request


def _produce_everywhere(broker: Broker, wire: RawWire, request: pb.ProduceRequest) -> Errors:
    unary = _unary(broker.stub.Produce, request)
    stream = _errors(next(iter(broker.stub.ProduceStream(iter([request]), timeout=10))))
    wire.produce(request)
    framed = _errors(pb.ProduceResponse.FromString(wire.answer(FrameType.PRODUCE)))
    assert unary == stream == framed, f"gRPC {unary}, gRPC stream {stream}, wire {framed}"
    return framed


def _fetch_everywhere(broker: Broker, wire: RawWire, request: pb.FetchRequest) -> Errors:
    unary = _unary(broker.stub.Fetch, request)
    stream = _errors(next(iter(broker.stub.FetchStream(iter([request]), timeout=10))))
    wire.fetch(request)
    framed = _errors(pb.FetchResponse.FromString(wire.answer(FrameType.FETCH)))
    assert unary == stream == framed, f"gRPC {unary}, gRPC stream {stream}, wire {framed}"
    return framed


def test_bad_produce_requests_get_the_same_error_over_grpc_and_wire(
    broker: Broker, wire: RawWire, topic: str
) -> None:
    broker.assign(topic, max_batch_bytes=1024)
    good = make_batch(vals(2))
    cases: list[tuple[pb.ProduceRequest, int, bool]] = [
        # (request, expected code, request-level?)
        (_produce(f"{topic}-unknown", 0, good), common_pb2.UNKNOWN_TOPIC_OR_PARTITION, False),
        # A partition of a topic this broker has on disk but does not serve.
        (_produce(topic, 5, good), common_pb2.NOT_LEADER, False),
        (_produce("no/such topic", 0, good), common_pb2.INVALID_TOPIC, False),
        (_produce(topic, -1, good), common_pb2.UNKNOWN_TOPIC_OR_PARTITION, False),
        (_produce(topic, 0, b"not a record batch at all"), common_pb2.CORRUPT_BATCH, False),
        (_produce(topic, 0, good[:-3]), common_pb2.CORRUPT_BATCH, False),
        (_produce(topic, 0, b""), common_pb2.CORRUPT_BATCH, False),
        # A batch an SDK from before batch format 2 wrote: refused, naming the fix.
        (_produce(topic, 0, to_v1(good)), common_pb2.UNSUPPORTED_VERSION, False),
        # Oversized: a batch past the topic's max_batch_bytes.
        (_produce(topic, 0, make_batch(vals(20, size=200))), common_pb2.BATCH_TOO_LARGE, False),
        (_produce(topic, 0, good, acks=5), common_pb2.INVALID_ARGUMENT, True),
        (pb.ProduceRequest(acks=1, request_id=7), common_pb2.INVALID_REQUEST, True),
    ]
    for request, code, request_level in cases:
        top, parts = _produce_everywhere(broker, wire, request)
        got = top if request_level else parts[0]
        assert got[0] == code, (request, top, parts)
        assert got[1], "a typed error says what was wrong"
        if code == common_pb2.UNSUPPORTED_VERSION:
            assert "batch format 1: upgrade the client" in got[1]
        if not request_level:
            assert top == _NONE
    # Nothing bad was appended by any of them, over any transport.
    assert broker.offsets(topic, -1).offset == 0


def test_bad_fetch_requests_get_the_same_error_over_grpc_and_wire(
    broker: Broker, wire: RawWire, topic: str
) -> None:
    broker.assign(topic)
    broker.produce(topic, 0, make_batch(vals(3)))
    cases: list[tuple[pb.FetchRequest, int, bool]] = [
        (_fetch(part(f"{topic}-unknown")), common_pb2.UNKNOWN_TOPIC_OR_PARTITION, False),
        (_fetch(part(topic, partition=9)), common_pb2.NOT_LEADER, False),
        (_fetch(part(topic, partition=-1)), common_pb2.UNKNOWN_TOPIC_OR_PARTITION, False),
        (_fetch(part(topic, offset=-4)), common_pb2.OFFSET_OUT_OF_RANGE, False),
        (_fetch(part(topic, offset=99)), common_pb2.OFFSET_OUT_OF_RANGE, False),
        (_fetch(part(topic, flt="tag:(")), common_pb2.INVALID_FILTER, False),
        (_fetch(part(topic, pmax=-1)), common_pb2.INVALID_ARGUMENT, False),
        # max_wait_ms past the broker's cap (5 s in this fixture).
        (_fetch(part(topic), max_wait_ms=60_000), common_pb2.INVALID_ARGUMENT, True),
        (_fetch(part(topic), min_bytes=-1), common_pb2.INVALID_ARGUMENT, True),
        # Oversized: asks for more bytes than the broker will ever answer with.
        (_fetch(part(topic), max_bytes=1 << 30), common_pb2.INVALID_ARGUMENT, True),
        (_fetch(part(topic), session_id=424242, session_epoch=3), common_pb2.FETCH_SESSION_NOT_FOUND, True),
        (_fetch(part(topic), session_epoch=-7), common_pb2.INVALID_FETCH_SESSION_EPOCH, True),
    ]
    for request, code, request_level in cases:
        top, parts = _fetch_everywhere(broker, wire, request)
        got = top if request_level else parts[0]
        assert got[0] == code, (request, top, parts)
        assert got[1], "a typed error says what was wrong"
        if code == common_pb2.UNSUPPORTED_VERSION:
            assert "batch format 1: upgrade the client" in got[1]
    # A good fetch still reads the same records on every path afterwards.
    assert _fetch_everywhere(broker, wire, _fetch(part(topic))) == (_NONE, [_NONE])


def test_a_continuous_fetch_is_refused_by_the_core_where_it_cannot_be_followed(
    broker: Broker, wire: RawWire, topic: str
) -> None:
    """The core validates ``continuous`` against what the transport can do: the same message
    over both gRPC paths; over the wire, a sessioned continuous fetch is refused instead."""
    broker.assign(topic)
    request = _fetch(part(topic), max_wait_ms=100, continuous=True)
    unary = _unary(broker.stub.Fetch, request)
    stream = _errors(next(iter(broker.stub.FetchStream(iter([request]), timeout=10))))
    assert unary == stream
    assert unary[0][0] == common_pb2.INVALID_REQUEST
    assert "only on the wire protocol" in unary[0][1]
    sessioned = _fetch(part(topic), max_wait_ms=100, continuous=True, session_epoch=0)
    wire.fetch(sessioned)
    top, _ = _errors(pb.FetchResponse.FromString(wire.answer(FrameType.FETCH)))
    assert top == (common_pb2.INVALID_REQUEST, "a continuous fetch is sessionless: set session_epoch to -1")
