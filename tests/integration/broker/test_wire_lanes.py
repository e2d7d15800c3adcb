"""Wire protocol version 2: fetch lanes on one connection (docs/wire.md, "Lanes"), over raw sockets.

Lanes are served independently (a long-poll on one does not hold another), a lane's follow sends
only as many answers as its window and credit allow, a lane can be ended alone, and a version-1
connection is served as before and refuses lane frames with a clear error.
"""

from __future__ import annotations

import select
import time
from collections.abc import Iterator

import pytest

from sluice.common.wire import LANE, LANE_CREDIT, FrameType
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2
from tests.wire_client import RawWire

from .conftest import Broker, make_batch, part, records


@pytest.fixture
def wire(broker: Broker) -> Iterator[RawWire]:
    conn = RawWire(broker.wire_address)
    yield conn
    conn.close()


def _lane_fetch(wire: RawWire, lane: int, window: int, request: pb.FetchRequest) -> None:
    wire.send(FrameType.FETCH_LANE, LANE_CREDIT.pack(lane, window) + request.SerializeToString())


def _lane_answer(wire: RawWire) -> tuple[int, pb.FetchResponse]:
    payload = wire.answer(FrameType.FETCH_LANE)
    return LANE.unpack_from(payload)[0], pb.FetchResponse.FromString(payload[LANE.size :])


def _nothing_within(wire: RawWire, seconds: float) -> bool:
    """No frame arrives within ``seconds``."""
    if wire.frames:
        return False
    return not select.select([wire.sock], [], [], seconds)[0]


def _follow(topic: str, offset: int, request_id: int, max_wait_ms: int = 5000) -> pb.FetchRequest:
    return pb.FetchRequest(
        max_wait_ms=max_wait_ms,
        min_bytes=1,
        session_epoch=-1,
        partitions=[part(topic, offset=offset)],
        continuous=True,
        request_id=request_id,
    )


def test_lanes_are_served_independently_on_one_connection(broker: Broker, wire: RawWire, topic: str) -> None:
    broker.assign(topic, partitions=2)
    broker.produce(topic, 1, make_batch([b"ready"]))
    assert wire.hello(version=2).version == 2
    # Lane 1 long-polls an empty partition; lane 2's fetch is answered meanwhile, not after it.
    _lane_fetch(
        wire,
        1,
        1,
        pb.FetchRequest(
            max_wait_ms=5000, min_bytes=1, session_epoch=-1, partitions=[part(topic)], request_id=1
        ),
    )
    started = time.monotonic()
    _lane_fetch(
        wire,
        2,
        1,
        pb.FetchRequest(
            max_wait_ms=5000, session_epoch=-1, partitions=[part(topic, partition=1)], request_id=2
        ),
    )
    lane, answer = _lane_answer(wire)
    assert (lane, answer.request_id) == (2, 2)
    assert time.monotonic() - started < 2.0, "lane 2 waited for lane 1's long-poll"
    assert [r.value for r in records(answer.partitions[0])] == [b"ready"]
    # Produce frames travel on the same connection, answered at once.
    request = pb.ProduceRequest(acks=1, timeout_ms=5000, request_id=3)
    request.partitions.add(topic=topic, partition=0, records=make_batch([b"late"]))
    wire.produce(request)
    got: dict[int, bytes] = {}
    while len(got) < 2:
        kind, payload = wire.recv() or (0, b"")
        assert kind in (FrameType.PRODUCE, FrameType.FETCH_LANE), kind
        got[kind] = payload
    assert pb.ProduceResponse.FromString(got[FrameType.PRODUCE]).request_id == 3
    lane1 = pb.FetchResponse.FromString(got[FrameType.FETCH_LANE][LANE.size :])
    assert LANE.unpack_from(got[FrameType.FETCH_LANE])[0] == 1
    assert [r.value for r in records(lane1.partitions[0])] == [b"late"]


def test_a_followed_lane_sends_no_more_than_its_credit(broker: Broker, wire: RawWire, topic: str) -> None:
    broker.assign(topic)
    for i in range(4):
        broker.produce(topic, 0, make_batch([b"r%d" % i]))
    wire.hello(version=2)
    # Window 1, 10 bytes a round: one record per answer, and one answer until more credit comes.
    request = _follow(topic, 0, 7)
    request.partitions[0].partition_max_bytes = 10
    _lane_fetch(wire, 5, 1, request)
    lane, first = _lane_answer(wire)
    assert (lane, first.request_id) == (5, 7)
    assert first.partitions[0].next_offset == 1
    assert _nothing_within(wire, 0.5), "the broker answered past the lane's window"
    wire.send(FrameType.LANE_CREDIT, LANE_CREDIT.pack(5, 2))
    offsets = [_lane_answer(wire)[1].partitions[0].next_offset for _ in range(2)]
    assert offsets == [2, 3]
    assert _nothing_within(wire, 0.5), "the broker answered past the credit"
    # Ending the lane: no more answers, even with credit and new records; the connection goes on.
    wire.send(FrameType.LANE_END, LANE.pack(5))
    wire.send(FrameType.LANE_CREDIT, LANE_CREDIT.pack(5, 10))  # for a lane gone: ignored
    broker.produce(topic, 0, make_batch([b"r4"]))
    assert _nothing_within(wire, 0.5), "an ended lane answered"
    _lane_fetch(wire, 6, 1, _follow(topic, 3, 8))
    lane, again = _lane_answer(wire)
    assert (lane, again.request_id) == (6, 8)
    assert [r.value for r in records(again.partitions[0], start=3)] == [b"r3", b"r4"]


def test_a_version_1_connection_refuses_lane_frames(broker: Broker, wire: RawWire, topic: str) -> None:
    broker.assign(topic)
    assert wire.hello(version=1).version == 1
    wire.send(
        FrameType.FETCH_LANE, LANE_CREDIT.pack(1, 1) + pb.FetchRequest(request_id=1).SerializeToString()
    )
    error = wire.closed_with_error()
    assert error.code == common_pb2.INVALID_REQUEST
    assert "needs protocol version 2" in error.message


@pytest.mark.parametrize(
    ("kind", "payload", "message"),
    [
        (FrameType.FETCH_LANE, b"\x00\x01", "lane header"),
        (FrameType.LANE_CREDIT, b"\x00\x00\x00\x01", "lane header"),
        (FrameType.LANE_END, b"\x00\x01", "lane header"),
        (FrameType.FETCH_LANE, LANE_CREDIT.pack(0, 1), "lanes are numbered from 1"),
    ],
    ids=["short-fetch", "short-credit", "short-end", "lane-0"],
)
def test_a_broken_lane_frame_is_refused(
    broker: Broker, wire: RawWire, topic: str, kind: FrameType, payload: bytes, message: str
) -> None:
    broker.assign(topic)
    wire.hello(version=2)
    wire.send(kind, payload)
    error = wire.closed_with_error()
    assert error.code == common_pb2.INVALID_REQUEST
    assert message in error.message


def test_empty_answers_use_no_credit(broker: Broker, wire: RawWire, topic: str) -> None:
    """An idle follow answers empty every max_wait without any credit frame: an empty answer
    holds nothing in the client's memory."""
    broker.assign(topic)
    wire.hello(version=2)
    _lane_fetch(wire, 3, 1, _follow(topic, 0, 9, max_wait_ms=100))
    for _ in range(3):
        lane, answer = _lane_answer(wire)
        assert (lane, answer.request_id) == (3, 9)
        assert not answer.partitions[0].records
    broker.produce(topic, 0, make_batch([b"one"]))
    while not (answer := _lane_answer(wire)[1]).partitions[0].records:
        pass  # empty rounds that were on the way
    assert [r.value for r in records(answer.partitions[0])] == [b"one"]
    broker.produce(topic, 0, make_batch([b"two"]))
    assert _nothing_within(wire, 0.5), "an answer with records past the window"
