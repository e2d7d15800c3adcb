"""SharedConnection (one wire connection per broker per client) against a scripted peer: what the
broker never does on purpose, or takes too long to arrange with a real one.

- a version-1 broker: a clear, non-retriable error naming the versions and the way out;
- a followed lane whose credit is spent waits without timing the connection out, while a request
  the peer never answers still does (failing everything the connection owes, retriable);
- closing one owner's view fails its own requests only.

The peer is a real TCP server on loopback speaking the wire protocol's frames.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from sluice.client.shared_wire import SharedConnection
from sluice.common.wire import LANE, LANE_CREDIT, FrameReader, FrameType, frame, lane_frame_parts
from sluice.errors import BrokerNotAvailable, InvalidRequest, RequestTimedOut
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import wire_pb2


class Peer:
    """Answers the hello with ``version``; a produce at once unless its ``acks`` is 0 (never);
    a lane fetch once, with records (a follow's window of 1 is then spent)."""

    def __init__(self, version: int = 2) -> None:
        self.version = version
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self.frames: list[int] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        reader = FrameReader()
        with sock:
            while data := sock.recv(65536):
                for kind, payload in reader.feed(data):
                    self.frames.append(kind)
                    if kind == FrameType.HELLO:
                        answer = wire_pb2.WireHelloResponse(version=self.version)
                        sock.sendall(frame(FrameType.HELLO, answer.SerializeToString()))
                    elif kind == FrameType.PRODUCE:
                        request = pb.ProduceRequest.FromString(payload)
                        if request.acks:
                            answer_p = pb.ProduceResponse(request_id=request.request_id)
                            sock.sendall(frame(FrameType.PRODUCE, answer_p.SerializeToString()))
                    elif kind == FrameType.FETCH_LANE:
                        lane, _ = LANE_CREDIT.unpack_from(payload)
                        request_f = pb.FetchRequest.FromString(payload[LANE_CREDIT.size :])
                        answer_f = pb.FetchResponse(
                            request_id=request_f.request_id,
                            partitions=[pb.FetchPartitionResponse(records=b"r")],
                        ).SerializeToString()
                        sock.sendall(
                            b"".join(lane_frame_parts(FrameType.FETCH_LANE, LANE.pack(lane), answer_f))
                        )


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


class Outcomes:
    def __init__(self) -> None:
        self.got: list[object] = []
        self.event = threading.Event()

    def __call__(self, outcome: object) -> None:
        self.got.append(outcome)
        self.event.set()

    def follow(self, outcome: object) -> bool:
        self(outcome)
        return True  # a followed request goes on

    def wait(self, timeout: float = 10) -> object:
        assert self.event.wait(timeout), "nothing settled"
        self.event.clear()
        return self.got[-1]


def _connection(address: str) -> SharedConnection:
    return SharedConnection(lambda: address, "test-shared")


def test_a_version_1_broker_gets_a_clear_error_not_a_retry() -> None:
    old = Peer(version=1)
    conn = _connection(old.address)
    try:
        outcomes = Outcomes()
        conn.produce_link().send(pb.ProduceRequest(acks=1), 10, outcomes)
        error = outcomes.wait()
        assert isinstance(error, InvalidRequest)
        assert not error.retriable
        assert "version 1" in error.message
        assert "SLUICE_CLIENT_TRANSPORT=grpc" in error.message
    finally:
        conn.close()
        old.close()


def test_a_follow_without_credit_waits_but_an_unanswered_request_times_out(peer: Peer) -> None:
    conn = _connection(peer.address)
    try:
        follow = Outcomes()
        lane = conn.fetch_lane()
        lane.follow(pb.FetchRequest(), 0.3, 1, follow.follow)  # answered once; its window is then spent
        assert isinstance(follow.wait(), pb.FetchResponse)
        time.sleep(0.8)  # well past the follow's span: no answer is due while it has no credit
        produced = Outcomes()
        conn.produce_link().send(pb.ProduceRequest(acks=1), 10, produced)
        assert isinstance(produced.wait(), pb.ProduceResponse)
        assert not follow.event.is_set()
        # Room for one more answer: now one is due within the span, and none comes.
        lane.grant(1)
        assert isinstance(follow.wait(), RequestTimedOut)
        # A new send connects again.
        conn.produce_link().send(pb.ProduceRequest(acks=1), 10, produced)
        assert isinstance(produced.wait(), pb.ProduceResponse)
        # A request never answered fails everything the connection owes, retriable.
        mute, other = Outcomes(), Outcomes()
        conn.produce_link().send(pb.ProduceRequest(acks=0), 0.3, mute)
        conn.fetch_lane().follow(pb.FetchRequest(), 30, 1, other.follow)
        assert isinstance(other.wait(), pb.FetchResponse)
        assert isinstance(mute.wait(), RequestTimedOut)
        assert isinstance(other.wait(), RequestTimedOut)
    finally:
        conn.close()


def test_closing_one_view_fails_its_own_requests_only(peer: Peer) -> None:
    conn = _connection(peer.address)
    try:
        mine, theirs = conn.produce_link(), conn.produce_link()
        waiting, answered = Outcomes(), Outcomes()
        mine.send(pb.ProduceRequest(acks=0), 30, waiting)  # never answered
        mine.close()
        assert isinstance(waiting.wait(), BrokerNotAvailable)
        theirs.send(pb.ProduceRequest(acks=0), 30, answered)
        lane = conn.fetch_lane()
        lane.close()
        assert not answered.event.wait(0.3)  # still waiting: nothing of 'theirs' was failed
        deadline = time.monotonic() + 5
        while FrameType.LANE_END not in peer.frames and time.monotonic() < deadline:
            time.sleep(0.01)  # the peer's thread records what it read
        assert FrameType.LANE_END in peer.frames
    finally:
        conn.close()


def test_a_followed_lane_grants_its_credit_window_minus_one_answers_at_a_time(peer: Peer) -> None:
    """Each LANE_CREDIT frame wakes the broker's loop: with a window of 3, one frame per two answers
    taken (docs/latency.md, "Second pass"), never fewer answers than the window allows."""
    conn = _connection(peer.address)
    try:
        follow = Outcomes()
        lane = conn.fetch_lane()
        lane.follow(pb.FetchRequest(), 30, 3, follow.follow)
        assert isinstance(follow.wait(), pb.FetchResponse)
        for _ in range(5):
            lane.grant(1)
        # A produce answered after the grants: the peer has read every frame written before it.
        produced = Outcomes()
        conn.produce_link().send(pb.ProduceRequest(acks=1), 10, produced)
        assert isinstance(produced.wait(), pb.ProduceResponse)
        assert peer.frames.count(FrameType.LANE_CREDIT) == 2  # after the 2nd and the 4th answer
    finally:
        conn.close()
