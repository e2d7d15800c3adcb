"""Property-based fuzzing of Produce and Fetch against a running broker.

Whatever arrives, the broker stays up and answers with typed errors: per-partition codes
from the expected set, or a gRPC status carrying a ``sluice-error-code`` (never INTERNAL).
Nothing malformed reaches the log: the whole log still decodes with every CRC checked.
"""

from __future__ import annotations

import queue
import struct
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sluice.client.rpc import ERROR_CODE_KEY
from sluice.client.streams import RequestStream
from sluice.codec.batch import CRC_AT, CRC_START, crc32c, decode_records, validate_batch
from sluice.errors import BatchTooLarge, CorruptBatch, UnsupportedCompression, UnsupportedVersion
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2

from .conftest import Broker, make_batch

TOPIC = "fuzz"
PARTITIONS = 2
MAX_BATCH = 2048
SETTINGS = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

PRODUCE_CODES = {
    common_pb2.NONE,
    common_pb2.CORRUPT_BATCH,
    common_pb2.BATCH_TOO_LARGE,
    common_pb2.UNSUPPORTED_VERSION,  # a flip turned the magic into 1
    common_pb2.UNSUPPORTED_COMPRESSION,  # attribute bits that name no codec, under a valid CRC
    common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
    common_pb2.NOT_LEADER,
    common_pb2.INVALID_TOPIC,
    common_pb2.INVALID_REQUEST,
    *(
        IDEMPOTENCE_CODES := {
            # A valid batch with producer fields (idempotence): out of sequence, of a producer the broker does
            # not know starting past 0, or of a fenced epoch.
            common_pb2.OUT_OF_ORDER_SEQUENCE,
            common_pb2.UNKNOWN_PRODUCER_ID,
            common_pb2.INVALID_PRODUCER_EPOCH,
        }
    ),
}
FETCH_CODES = {
    common_pb2.NONE,
    common_pb2.OFFSET_OUT_OF_RANGE,
    common_pb2.UNKNOWN_TOPIC_OR_PARTITION,
    common_pb2.NOT_LEADER,
    common_pb2.INVALID_TOPIC,
    common_pb2.INVALID_FILTER,
    common_pb2.INVALID_ARGUMENT,
}


@pytest.fixture(scope="module")
def fuzz_broker(broker: Broker) -> Broker:
    broker.assign(TOPIC, partitions=PARTITIONS, topic_id="fuzz-id", max_batch_bytes=MAX_BATCH)
    return broker


def _recrc(buf: bytearray) -> None:
    if len(buf) >= CRC_START:
        struct.pack_into("<I", buf, CRC_AT, crc32c(bytes(buf[CRC_START:])))


@st.composite
def produce_payload(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(1, 20))
    tags = draw(st.sampled_from([None, "a", ["a", "b"] * 10]))
    size = draw(st.integers(0, 200))
    good = make_batch([b"x" * size] * n, tags if not isinstance(tags, list) else tags[:n])
    kinds = ["good", "random", "truncated", "flipped", "flipped-recrc", "oversized", "trailer"]
    kind = draw(st.sampled_from(kinds))
    if kind == "good":
        return good
    if kind == "random":
        return draw(st.binary(max_size=400))
    if kind == "truncated":
        return good[: draw(st.integers(0, len(good) - 1))]
    if kind == "oversized":
        return make_batch([b"y" * (MAX_BATCH + draw(st.integers(1, 5000)))])
    if kind == "trailer":
        return good + draw(st.binary(min_size=1, max_size=80))
    buf = bytearray(good)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(buf) - 1))
        buf[i] ^= draw(st.integers(1, 255))
    if kind == "flipped-recrc":
        _recrc(buf)  # reach the checks behind the CRC
    return bytes(buf)


def _locally_valid(payload: bytes) -> bool:
    pos = 0
    try:
        while pos < len(payload):
            h = validate_batch(payload, pos, MAX_BATCH)
            if h.last_offset_delta != h.record_count - 1:
                return False
            idempotent = h.producer_id != -1
            if idempotent and min(h.producer_id, h.producer_epoch, h.base_sequence) < 0:
                return False  # producer fields that no producer sends: CORRUPT_BATCH
            pos += h.length
    except (CorruptBatch, BatchTooLarge, UnsupportedVersion, UnsupportedCompression):
        return False
    return len(payload) > 0


def _assert_typed(exc: grpc.RpcError) -> None:
    assert exc.code() != grpc.StatusCode.INTERNAL, exc.details()
    trailers: Any = exc.trailing_metadata()
    codes = [v for k, v in (trailers or ()) if k == ERROR_CODE_KEY]
    assert codes, (exc.code(), exc.details())
    assert int(codes[0]) != common_pb2.UNKNOWN, (exc.code(), exc.details())


@SETTINGS
@given(
    payload=produce_payload(),
    # Mostly well-addressed, so most examples reach batch validation.
    partition=st.sampled_from([0, 1, 0, 1, 0, 1, 7, -1]),
    topic=st.sampled_from([TOPIC] * 6 + ["nope", "", "bad topic", "x" * 300]),
    acks=st.sampled_from([1] * 6 + [0, -1, 5]),
    timeout_ms=st.sampled_from([0] * 6 + [1000, -3, 10**9]),
)
def test_fuzz_produce(
    fuzz_broker: Broker, payload: bytes, partition: int, topic: str, acks: int, timeout_ms: int
) -> None:
    req = pb.ProduceRequest(
        acks=acks,
        timeout_ms=timeout_ms,
        partitions=[pb.ProducePartition(topic=topic, partition=partition, records=payload)],
    )
    try:
        resp = fuzz_broker.stub.Produce(req, timeout=10)
    except grpc.RpcError as exc:
        _assert_typed(exc)
        assert acks not in (-1, 0, 1) or not 0 <= timeout_ms <= 300_000
        return
    (r,) = resp.partitions
    event(f"produce: {common_pb2.ErrorCode.Name(r.error.code)}")
    assert r.error.code in PRODUCE_CODES, r.error
    if r.error.code == common_pb2.NONE:
        assert topic == TOPIC
        assert partition in (0, 1)
        assert _locally_valid(payload)
    elif topic == TOPIC and partition in (0, 1) and r.error.code not in IDEMPOTENCE_CODES:
        assert not _locally_valid(payload)


filters = st.one_of(
    st.sampled_from(["", "*", "a", "b", "a || b", "zz", "a ||", "|| ||", "a b", "*||a"]),
    st.text(alphabet="ab|* _-?", max_size=12),
)


@SETTINGS
@given(
    offsets=st.lists(
        st.tuples(
            st.sampled_from([TOPIC, TOPIC, "nope", "bad topic"]),
            st.sampled_from([0, 1, 3, -2]),
            st.one_of(st.integers(-5, 400), st.integers(-(2**63), 2**63 - 1)),
            st.one_of(st.integers(-5, 5000), st.integers(-(2**31), 2**31 - 1)),
            filters,
        ),
        max_size=4,
    ),
    max_wait_ms=st.one_of(st.integers(-1000, 30), st.integers(5001, 2**31 - 1)),
    min_bytes=st.one_of(st.integers(-5, 10), st.integers(-(2**31), 2**31 - 1)),
    max_bytes=st.one_of(st.integers(-5, 10_000), st.integers(-(2**31), 2**31 - 1)),
    session=st.sampled_from([(0, -1), (0, -1), (0, 0), (12345, 1), (0, 7), (99, -5)]),
)
def test_fuzz_fetch(
    fuzz_broker: Broker,
    offsets: list[tuple[str, int, int, int, str]],
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    session: tuple[int, int],
) -> None:
    req = pb.FetchRequest(
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        session_id=session[0],
        session_epoch=session[1],
        partitions=[
            pb.FetchPartition(topic=t, partition=p, fetch_offset=o, partition_max_bytes=m, filter=f)
            for t, p, o, m, f in offsets
        ],
    )
    try:
        resp = fuzz_broker.stub.Fetch(req, timeout=10)
    except grpc.RpcError as exc:
        _assert_typed(exc)
        return
    assert resp.error.code in {
        common_pb2.NONE,
        common_pb2.FETCH_SESSION_NOT_FOUND,
        common_pb2.INVALID_FETCH_SESSION_EPOCH,
    }
    for p in resp.partitions:
        event(f"fetch: {common_pb2.ErrorCode.Name(p.error.code)}")
        assert p.error.code in FETCH_CODES, p.error
        if p.error.code == common_pb2.NONE:
            assert p.log_start_offset <= p.next_offset <= p.high_watermark
            decode_records(p.records, p.topic, p.partition)  # every returned batch passes its CRC
        else:
            assert p.records == b""


@pytest.fixture(scope="module")
def produce_stream(fuzz_broker: Broker) -> Iterator[RequestStream[pb.ProduceRequest, pb.ProduceResponse]]:
    """One ProduceStream for every example: no input may end it."""
    stream = RequestStream(fuzz_broker.stub.ProduceStream, "fuzz-produce")
    yield stream
    stream.close()


@pytest.fixture(scope="module")
def fetch_stream(fuzz_broker: Broker) -> Iterator[RequestStream[pb.FetchRequest, pb.FetchResponse]]:
    stream = RequestStream(fuzz_broker.stub.FetchStream, "fuzz-fetch")
    yield stream
    stream.close()


def _answers(count: int, results: queue.SimpleQueue[object]) -> list[object]:
    return [results.get(timeout=20) for _ in range(count)]


@settings(SETTINGS, max_examples=150)
@given(
    requests=st.lists(
        st.tuples(
            produce_payload(),
            st.sampled_from([0, 1, 7, -1]),
            st.sampled_from([TOPIC, TOPIC, "nope", ""]),
            st.sampled_from([1, 1, 0, -1, 5]),
            st.sampled_from([0, 0, -3, 10**9]),
            st.booleans(),  # no partitions at all
        ),
        min_size=1,
        max_size=5,
    )
)
def test_fuzz_produce_stream(
    produce_stream: RequestStream[pb.ProduceRequest, pb.ProduceResponse],
    requests: list[tuple[bytes, int, str, int, int, bool]],
) -> None:
    """Pipelined garbage on one ProduceStream: each request gets its own answer, in order, with a
    typed code (request-level errors in ``error``); the stream itself never ends."""
    results: queue.SimpleQueue[object] = queue.SimpleQueue()
    for payload, partition, topic, acks, timeout_ms, empty in requests:
        req = pb.ProduceRequest(acks=acks, timeout_ms=timeout_ms)
        if not empty:
            req.partitions.add(topic=topic, partition=partition, records=payload)
        produce_stream.send(req, 10, results.put)
    for answer, (payload, _partition, _topic, acks, timeout_ms, empty) in zip(
        _answers(len(requests), results), requests, strict=True
    ):
        assert isinstance(answer, pb.ProduceResponse), answer  # not a transport failure
        if empty or acks not in (-1, 0, 1) or not 0 <= timeout_ms <= 300_000:
            assert answer.error.code in (common_pb2.INVALID_REQUEST, common_pb2.INVALID_ARGUMENT), answer
            assert not answer.partitions
            continue
        assert answer.error.code == common_pb2.NONE
        (r,) = answer.partitions
        assert r.error.code in PRODUCE_CODES, r.error
        if r.error.code == common_pb2.NONE:
            assert _locally_valid(payload)


@settings(SETTINGS, max_examples=150)
@given(
    requests=st.lists(
        st.tuples(
            st.sampled_from([TOPIC, "nope", "bad topic"]),
            st.sampled_from([0, 1, 3]),
            st.integers(-5, 400),
            filters,
            st.sampled_from([0, 0, 10, -1, 10**6]),  # max_wait_ms
            st.sampled_from([(0, -1), (0, -1), (12345, 1), (99, -5)]),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_fuzz_fetch_stream(
    fetch_stream: RequestStream[pb.FetchRequest, pb.FetchResponse],
    requests: list[tuple[str, int, int, str, int, tuple[int, int]]],
) -> None:
    results: queue.SimpleQueue[object] = queue.SimpleQueue()
    for topic, partition, offset, flt, max_wait_ms, session in requests:
        req = pb.FetchRequest(
            max_wait_ms=max_wait_ms,
            session_id=session[0],
            session_epoch=session[1],
            partitions=[pb.FetchPartition(topic=topic, partition=partition, fetch_offset=offset, filter=flt)],
        )
        fetch_stream.send(req, 10, results.put)
    for answer in _answers(len(requests), results):
        assert isinstance(answer, pb.FetchResponse), answer  # not a transport failure
        assert answer.error.code in {
            common_pb2.NONE,
            common_pb2.INVALID_ARGUMENT,
            common_pb2.FETCH_SESSION_NOT_FOUND,
            common_pb2.INVALID_FETCH_SESSION_EPOCH,
        }, answer.error
        for p in answer.partitions:
            assert p.error.code in FETCH_CODES, p.error


def test_after_fuzzing_the_broker_is_alive_and_the_log_is_clean(fuzz_broker: Broker) -> None:
    assert fuzz_broker.alive()
    for p in range(PARTITIONS):
        r = fuzz_broker.produce(TOPIC, p, make_batch([b"after"]))
        assert r.error.code == common_pb2.NONE
        hwm = r.base_offset + 1
        data, offset = b"", 0
        while offset < hwm:
            resp = fuzz_broker.fetch_one(TOPIC, offset, partition=p)
            assert resp.error.code == common_pb2.NONE
            data += resp.records
            offset = resp.next_offset
        got = decode_records(data, TOPIC, p)
        assert [x.offset for x in got] == list(range(hwm))
        assert got[-1].value == b"after"
