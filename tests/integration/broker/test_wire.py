"""The wire protocol (docs/wire.md) against a real broker process, spoken over raw sockets.

What a client may rely on: the hello comes first; answers come in request order with their
request ids; a request's own error is in its answer and the connection goes on; a frame that
breaks the protocol gets an error frame and the connection closes, and the broker stays
healthy for everyone else.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.common.wire import HEADER, FrameType, frame
from sluice.errors import BrokerNotAvailable, SluiceError
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2, wire_pb2
from tests.wire_client import RawWire
from tests.wire_v1_client import WireConnection

from .conftest import Broker, make_batch, part, records, rpc_error, running_broker, start_broker, vals


@pytest.fixture
def wire(broker: Broker) -> Iterator[RawWire]:
    conn = RawWire(broker.wire_address)
    yield conn
    conn.close()


def _produce(topic: str, values: list[bytes], request_id: int) -> pb.ProduceRequest:
    request = pb.ProduceRequest(acks=1, timeout_ms=5000, request_id=request_id)
    request.partitions.add(topic=topic, partition=0, records=make_batch(values))
    return request


def _healthy(broker: Broker, topic: str) -> None:
    """A fresh connection still produces and fetches."""
    conn = RawWire(broker.wire_address)
    try:
        assert conn.hello().version == 1
        conn.produce(_produce(topic, [b"after"], 1))
        answer = pb.ProduceResponse.FromString(conn.answer(FrameType.PRODUCE))
        assert answer.error.code == common_pb2.NONE, answer
    finally:
        conn.close()
    assert broker.alive()


def test_hello_then_pipelined_produces_are_answered_in_order(
    broker: Broker, wire: RawWire, topic: str
) -> None:
    broker.assign(topic)
    hello = wire.hello()
    assert hello.version == 1
    assert not hello.error.code
    assert hello.max_frame_bytes >= 1 << 20
    for i in range(20):
        wire.produce(_produce(topic, vals(3, f"r{i}-"), request_id=100 + i))
        if i == 10:
            wire.produce(pb.ProduceRequest(acks=1, request_id=555))  # names no partitions
    answers = [pb.ProduceResponse.FromString(wire.answer(FrameType.PRODUCE)) for _ in range(21)]
    assert [a.request_id for a in answers] == [100 + i for i in range(11)] + [555] + [
        100 + i for i in range(11, 20)
    ]
    assert answers[11].error.code == common_pb2.INVALID_REQUEST  # its own error; the connection goes on
    ok = [a for a in answers if a.request_id != 555]
    assert [a.partitions[0].base_offset for a in ok] == [3 * i for i in range(20)]
    assert [r.value for r in records(broker.fetch_one(topic, 0))] == [
        f"r{i}-{j}".encode() for i in range(20) for j in range(3)
    ]
    # Each frame is counted as the request it carries, as the gRPC methods are.
    assert (broker.metric("sluice_broker_rpc_requests_total", method="Produce", code="OK") or 0) >= 20


def test_fetch_over_the_wire_long_polls_until_a_produce_arrives(
    broker: Broker, wire: RawWire, topic: str
) -> None:
    broker.assign(topic)
    wire.hello()
    wire.fetch(
        pb.FetchRequest(
            max_wait_ms=5000, min_bytes=1, session_epoch=-1, partitions=[part(topic)], request_id=7
        )
    )
    time.sleep(0.2)  # parked by now
    started = time.monotonic()
    broker.produce(topic, 0, make_batch([b"late"]))
    answer = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    assert time.monotonic() - started < 2.0, "the fetch waited out max_wait instead of waking on the append"
    assert answer.request_id == 7
    assert [r.value for r in records(answer.partitions[0])] == [b"late"]
    # A second fetch on the same connection: served after the first, in order.
    wire.fetch(
        pb.FetchRequest(max_wait_ms=0, session_epoch=-1, partitions=[part(topic, offset=1)], request_id=8)
    )
    wire.fetch(
        pb.FetchRequest(max_wait_ms=0, session_epoch=-1, partitions=[part("no-such-topic")], request_id=9)
    )
    second = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    third = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    assert (second.request_id, third.request_id) == (8, 9)
    assert third.partitions[0].error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION


def test_under_flush_always_pipelined_answers_keep_their_order(tmp_path: Path, topic: str) -> None:
    with running_broker(tmp_path / "data", flush="always") as b:
        b.assign(topic)
        conn = RawWire(b.wire_address)
        try:
            conn.hello()
            for i in range(30):
                conn.produce(_produce(topic, vals(2, f"a{i}-"), request_id=i + 1))
            answers = [pb.ProduceResponse.FromString(conn.answer(FrameType.PRODUCE)) for _ in range(30)]
        finally:
            conn.close()
        assert [a.request_id for a in answers] == list(range(1, 31))
        assert [a.partitions[0].base_offset for a in answers] == [2 * i for i in range(30)]
        assert all(a.error.code == common_pb2.NONE for a in answers)


@pytest.mark.parametrize(
    ("first", "message"),
    [
        (frame(FrameType.PRODUCE, b""), "the first frame must be a hello"),
        (frame(FrameType.HELLO, wire_pb2.WireHello(version=0).SerializeToString()), "version 0"),
        (frame(FrameType.HELLO, b"\xff\xff\xff"), "not a valid WireHello"),
        (HEADER.pack(2**31, FrameType.PRODUCE), "frames hold 1 to"),
        (HEADER.pack(0, FrameType.PRODUCE), "frames hold 1 to"),
    ],
    ids=["request-before-hello", "version-0", "garbled-hello", "oversized", "zero-length"],
)
def test_a_broken_start_gets_an_error_frame_and_a_close(
    broker: Broker, wire: RawWire, topic: str, first: bytes, message: str
) -> None:
    broker.assign(topic)
    wire.sock.sendall(first)
    error = wire.closed_with_error()
    assert error.code == common_pb2.INVALID_REQUEST
    assert message in error.message
    _healthy(broker, topic)


@pytest.mark.parametrize(
    ("kind", "payload", "message"),
    [
        (FrameType.PRODUCE, b"\x0a\xff\xff", "not a valid ProduceRequest"),
        (FrameType.FETCH, b"\x32\x05abc", "not a valid FetchRequest"),
        (FrameType.HELLO, wire_pb2.WireHello(version=1).SerializeToString(), "a second hello"),
        (42, b"x", "unknown frame type 42"),
        (FrameType.ERROR, b"", "unknown frame type 127"),
    ],
    ids=["garbled-produce", "garbled-fetch", "second-hello", "unknown-type", "error-from-client"],
)
def test_a_broken_frame_after_the_hello_gets_an_error_frame_and_a_close(
    broker: Broker, wire: RawWire, topic: str, kind: int, payload: bytes, message: str
) -> None:
    broker.assign(topic)
    wire.hello()
    wire.produce(_produce(topic, [b"before"], 1))
    wire.send(kind, payload)
    # What came before the broken frame is still answered.
    assert pb.ProduceResponse.FromString(wire.answer(FrameType.PRODUCE)).request_id == 1
    error = wire.closed_with_error()
    assert error.code == common_pb2.INVALID_REQUEST
    assert message in error.message
    _healthy(broker, topic)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=200)), min_size=1, max_size=6))
def test_fuzzed_frames_never_hurt_the_broker(
    broker: Broker, topic: str, junk: list[tuple[int, bytes]]
) -> None:
    """Any frames after a hello: each is answered or the connection ends with an error frame."""
    broker.assign(topic)
    conn = RawWire(broker.wire_address)
    try:
        conn.hello()
        for kind, payload in junk:
            conn.send(kind, payload)
        conn.sock.shutdown(socket.SHUT_WR)
        while (got := conn.recv()) is not None:
            assert got[0] in (FrameType.PRODUCE, FrameType.FETCH, FrameType.ERROR)
    except OSError:
        pass  # the broker closed first (reset, broken pipe, not connected): it must still serve
    finally:
        conn.close()
    _healthy(broker, topic)


def test_a_connection_that_does_not_read_is_throttled_not_buffered(broker: Broker, topic: str) -> None:
    """A client that sends without reading stops being read from; the broker keeps serving others."""
    broker.assign(topic)
    conn = RawWire(broker.wire_address)
    conn.hello()
    conn.sock.setblocking(False)
    # Large requests (padded), so socket buffers alone cannot absorb them all.
    request = pb.FetchRequest(
        max_wait_ms=0, session_epoch=-1, partitions=[part(topic, pmax=1 << 20)], client_id="p" * 50_000
    ).SerializeToString()
    broker.produce(topic, 0, make_batch([b"x" * 500_000]))
    sent = 0
    try:
        for _ in range(2_000):
            conn.sock.send(frame(FrameType.FETCH, request))
            sent += 1
    except BlockingIOError:
        pass  # the broker stopped reading: its socket buffer and ours are full
    finally:
        conn.close()
    assert sent < 1_000, f"the broker read {sent} requests of a client that reads no answer"
    _healthy(broker, topic)


def test_the_sdk_connection_fails_waiting_requests_when_the_broker_dies_and_reconnects(
    tmp_path: Path, topic: str
) -> None:
    b = start_broker(tmp_path / "data", "--wire-port", "0")
    b.assign(topic)
    conn: WireConnection[pb.FetchRequest, pb.FetchResponse] = WireConnection(
        b.wire_address, FrameType.FETCH, pb.FetchResponse, "test-fetch"
    )
    outcomes: list[object] = []
    done = threading.Event()

    def settle(outcome: object) -> None:
        outcomes.append(outcome)
        done.set()

    try:
        parked = pb.FetchRequest(max_wait_ms=30_000, min_bytes=1, session_epoch=-1, partitions=[part(topic)])
        conn.send(parked, 60, settle)
        time.sleep(0.3)
        b.kill()
        assert done.wait(10), "a request waiting on a dead broker was never failed"
        assert isinstance(outcomes[0], BrokerNotAvailable)
        assert outcomes[0].retriable
        restarted = start_broker(tmp_path / "data", "--wire-port", b.wire_address.rsplit(":", 1)[1])
        try:
            restarted.assign(topic)
            done.clear()
            conn.send(pb.FetchRequest(max_wait_ms=0, session_epoch=-1, partitions=[part(topic)]), 10, settle)
            assert done.wait(10)
            answer = outcomes[1]
            assert isinstance(answer, pb.FetchResponse), answer
            assert not isinstance(answer, SluiceError)
            assert answer.partitions[0].error.code == common_pb2.NONE
        finally:
            restarted.stop()
    finally:
        conn.close()


def test_a_continuous_fetch_answers_again_from_each_answers_end(
    broker: Broker, wire: RawWire, topic: str
) -> None:
    broker.assign(topic)
    broker.produce(topic, 0, make_batch([b"a", b"b"]))
    wire.hello()
    request = pb.FetchRequest(
        max_wait_ms=5000,
        min_bytes=1,
        session_epoch=-1,
        partitions=[part(topic)],
        continuous=True,
        request_id=3,
    )
    wire.fetch(request)
    first = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    assert [r.value for r in records(first.partitions[0])] == [b"a", b"b"]
    # No second request: the broker fetches again from offset 2 and answers when records come.
    broker.produce(topic, 0, make_batch([b"c"]))
    second = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    assert second.request_id == 3
    assert [r.value for r in records(second.partitions[0], start=2)] == [b"c"]
    assert second.partitions[0].next_offset == 3
    # Another fetch frame replaces it (after the round in flight, which max_wait ends).
    wire.fetch(
        pb.FetchRequest(max_wait_ms=0, session_epoch=-1, partitions=[part(topic, offset=0)], request_id=4)
    )
    ids: list[int] = []
    while not ids or ids[-1] != 4:
        ids.append(pb.FetchResponse.FromString(wire.answer(FrameType.FETCH)).request_id)
    assert set(ids) <= {3, 4}
    broker.produce(topic, 0, make_batch([b"d"]))
    wire.fetch(
        pb.FetchRequest(max_wait_ms=0, session_epoch=-1, partitions=[part(topic, offset=3)], request_id=5)
    )
    last = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    assert last.request_id == 5, "the replaced continuous fetch answered again"


def test_a_continuous_fetch_with_a_session_is_refused_in_its_answer(
    broker: Broker, wire: RawWire, topic: str
) -> None:
    broker.assign(topic)
    wire.hello()
    wire.fetch(
        pb.FetchRequest(
            max_wait_ms=0, session_epoch=0, partitions=[part(topic)], continuous=True, request_id=9
        )
    )
    answer = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    assert answer.request_id == 9
    assert answer.error.code == common_pb2.INVALID_REQUEST
    assert "sessionless" in answer.error.message


def test_a_continuous_fetch_over_grpc_is_refused_typed(broker: Broker, topic: str) -> None:
    """gRPC answers one fetch per request, so it refuses ``continuous`` instead of ignoring it."""
    broker.assign(topic)
    request = pb.FetchRequest(max_wait_ms=0, session_epoch=-1, partitions=[part(topic)], continuous=True)
    with pytest.raises(grpc.RpcError) as unary:
        broker.stub.Fetch(request, timeout=10)
    refused = rpc_error(unary.value)
    assert refused.code == common_pb2.INVALID_REQUEST
    assert "only on the wire protocol" in refused.message
    (answer,) = list(broker.stub.FetchStream(iter([request]), timeout=10))
    assert answer.error.code == common_pb2.INVALID_REQUEST
    assert "only on the wire protocol" in answer.error.message


def _continuous(topic: str, request_id: int, max_wait_ms: int = 5000, pmax: int = 0) -> pb.FetchRequest:
    return pb.FetchRequest(
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        session_epoch=-1,
        partitions=[part(topic, pmax=pmax)],
        continuous=True,
        request_id=request_id,
    )


def test_a_continuous_fetch_drains_a_backlog_in_order_then_waits_for_appends(
    broker: Broker, wire: RawWire, topic: str
) -> None:
    broker.assign(topic)
    for i in range(20):
        broker.produce(topic, 0, make_batch(vals(5, prefix=f"b{i}-", size=200)))
    wire.hello()
    wire.fetch(_continuous(topic, 7, pmax=2500))  # about two batches per answer
    seen: list[int] = []
    while len(seen) < 100:
        answer = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
        assert answer.request_id == 7
        p = answer.partitions[0]
        assert p.error.code == common_pb2.NONE
        got = [r.offset for r in records(p, start=len(seen))]
        assert got, "an answer from a backlog is never empty"
        assert p.next_offset == got[-1] + 1
        seen += got
    assert seen == list(range(100))
    broker.produce(topic, 0, make_batch([b"late"]))
    answer = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    assert [r.value for r in records(answer.partitions[0], start=100)] == [b"late"]


def test_a_continuous_fetch_answers_empty_every_max_wait_while_nothing_comes(
    broker: Broker, wire: RawWire, topic: str
) -> None:
    broker.assign(topic)
    wire.hello()
    wire.fetch(_continuous(topic, 8, max_wait_ms=200))
    started = time.monotonic()
    for _ in range(3):
        answer = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
        assert answer.request_id == 8
        assert answer.partitions[0].records == b""
        assert answer.partitions[0].next_offset == 0
    # Three rounds of max_wait each: not at once (a busy loop), not much later (a lost timer).
    assert 0.55 <= time.monotonic() - started < 3.0


def test_a_continuous_fetch_stops_after_an_answer_with_an_error(
    broker: Broker, wire: RawWire, topic: str
) -> None:
    """The partition moves away: the parked round answers NOT_LEADER at once and follows no more."""
    broker.assign(topic)
    broker.produce(topic, 0, make_batch([b"a"]))
    wire.hello()
    wire.fetch(_continuous(topic, 9, max_wait_ms=2000))
    first = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    assert first.partitions[0].next_offset == 1
    started = time.monotonic()
    gone = pb.PartitionAssignment(topic=topic, topic_id="id-1", partition=0)
    broker.stub.UpdatePartitions(pb.UpdatePartitionsRequest(remove=[gone]), timeout=10)
    moved = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    assert time.monotonic() - started < 1.5, "the parked round did not wake for the move"
    assert moved.request_id == 9
    assert moved.partitions[0].error.code == common_pb2.NOT_LEADER
    # Nothing more comes for request 9; the connection still serves new requests.
    wire.sock.settimeout(2.5)
    with pytest.raises(TimeoutError):
        wire.recv()
    wire.sock.settimeout(10)
    broker.assign(topic)
    wire.fetch(pb.FetchRequest(max_wait_ms=0, session_epoch=-1, partitions=[part(topic)], request_id=10))
    again = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    assert again.request_id == 10
    assert again.partitions[0].error.code == common_pb2.NONE


def test_a_continuous_fetch_without_max_wait_is_refused(broker: Broker, wire: RawWire, topic: str) -> None:
    broker.assign(topic)
    wire.hello()
    wire.fetch(_continuous(topic, 11, max_wait_ms=0))
    answer = pb.FetchResponse.FromString(wire.answer(FrameType.FETCH))
    assert answer.error.code == common_pb2.INVALID_REQUEST
    assert "max_wait_ms > 0" in answer.error.message


class _Followed:
    """What a followed request's ``on_answer`` got, and what it says about going on."""

    def __init__(self) -> None:
        self.answers: list[object] = []
        self.arrived = threading.Condition()

    def on_answer(self, outcome: object) -> bool:
        with self.arrived:
            self.answers.append(outcome)
            self.arrived.notify_all()
        if isinstance(outcome, SluiceError):
            return False
        assert isinstance(outcome, pb.FetchResponse)
        return not any(p.error.code for p in outcome.partitions)  # the broker stops after an error

    def wait_for(self, count: int, timeout: float = 10) -> list[object]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.answers) >= count, timeout), self.answers
            return list(self.answers)


def _answers_a_fetch(conn: WireConnection[pb.FetchRequest, pb.FetchResponse], topic: str) -> None:
    """An ordinary fetch on ``conn`` is answered, without an error."""
    answered: list[object] = []
    done = threading.Event()

    def settle(outcome: object) -> None:
        answered.append(outcome)
        done.set()

    conn.send(pb.FetchRequest(max_wait_ms=0, session_epoch=-1, partitions=[part(topic)]), 10, settle)
    assert done.wait(10)
    assert isinstance(answered[0], pb.FetchResponse), answered
    assert answered[0].partitions[0].error.code == common_pb2.NONE


def test_the_sdk_connection_follows_and_a_later_request_replaces_the_followed_one(
    broker: Broker, topic: str
) -> None:
    broker.assign(topic)
    conn: WireConnection[pb.FetchRequest, pb.FetchResponse] = WireConnection(
        broker.wire_address, FrameType.FETCH, pb.FetchResponse, "test-follow"
    )
    followed = _Followed()
    try:
        # Each answer is due within 1 s of the last; the broker answers at least every 300 ms.
        conn.follow(_continuous(topic, 0, max_wait_ms=300), 1.0, followed.on_answer)
        for i in range(3):
            broker.produce(topic, 0, make_batch([b"v%d" % i]))
        answers: list[pb.FetchResponse] = []
        while sum(len(records(a.partitions[0])) for a in answers) < 3:
            answers = [a for a in followed.wait_for(len(answers) + 1) if isinstance(a, pb.FetchResponse)]
        assert {a.request_id for a in answers} == {1}
        # A later request replaces it; once that is answered, nothing waits on the followed one.
        _answers_a_fetch(conn, topic)
        settled = len(followed.wait_for(0))
        time.sleep(2.5)  # past the followed request's deadline: it must not fail the connection
        assert not any(isinstance(a, SluiceError) for a in followed.answers), followed.answers
        assert len(followed.answers) <= settled + 1  # at most one answer already on the way
        _answers_a_fetch(conn, topic)  # the connection still serves requests
    finally:
        conn.close()


def test_the_sdk_connection_drops_a_followed_request_its_answer_ended(broker: Broker, topic: str) -> None:
    """The broker stops following after an answer with an error; the connection must not then
    wait for more (and fail with a timeout)."""
    broker.assign(topic)
    broker.produce(topic, 0, make_batch([b"a"]))
    conn: WireConnection[pb.FetchRequest, pb.FetchResponse] = WireConnection(
        broker.wire_address, FrameType.FETCH, pb.FetchResponse, "test-follow-end"
    )
    followed = _Followed()
    try:
        conn.follow(_continuous(topic, 0, max_wait_ms=300), 1.0, followed.on_answer)
        followed.wait_for(1)
        gone = pb.PartitionAssignment(topic=topic, topic_id="id-1", partition=0)
        broker.stub.UpdatePartitions(pb.UpdatePartitionsRequest(remove=[gone]), timeout=10)
        answers = followed.wait_for(2)
        last = answers[-1]
        assert isinstance(last, pb.FetchResponse)
        assert last.partitions[0].error.code == common_pb2.NOT_LEADER
        time.sleep(2.5)
        assert len(followed.answers) == len(answers), followed.answers  # no timeout error came
        broker.assign(topic)
        _answers_a_fetch(conn, topic)  # the connection still serves requests
    finally:
        conn.close()
