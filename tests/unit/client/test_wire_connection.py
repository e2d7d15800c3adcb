"""WireConnection against a peer that breaks the wire contract: answers out of order, ends the
connection early, never answers, refuses the hello. Every waiting request fails with a typed
error (retriable where a retry can help), and the next send connects again.

The peer is a real TCP server on loopback speaking the wire protocol's frames; a misbehaving
peer is the only way to reach these paths (the broker itself never does this).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator

import pytest

from sluice.common.wire import FrameReader, FrameType, frame
from sluice.errors import BrokerNotAvailable, RequestTimedOut, SluiceError, Unauthenticated
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import common_pb2, wire_pb2
from tests.wire_v1_client import WireConnection


class Peer:
    """Accepts connections; ``mode`` (read at each connection) says how to answer produces:
    "ok", "swap" (pairs in reverse order), "end" (answer one of three, then close), "mute"
    (never answer), "refuse" (refuse the hello), "stray" (after two requests, answer one never
    sent), "pair" (after two requests, answer both in one write)."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._server.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(sock, self.mode), daemon=True).start()

    def _serve(self, sock: socket.socket, mode: str) -> None:
        reader = FrameReader()
        held: list[int] = []
        with sock:
            while data := sock.recv(65536):
                for kind, payload in reader.feed(data):
                    if kind == FrameType.HELLO:
                        answer = wire_pb2.WireHelloResponse(version=1)
                        if mode == "refuse":
                            answer.error.code = common_pb2.UNAUTHENTICATED
                            answer.error.message = "no credentials"
                        sock.sendall(frame(FrameType.HELLO, answer.SerializeToString()))
                        if mode == "refuse":
                            return
                        continue
                    request_id = pb.ProduceRequest.FromString(payload).request_id
                    if mode == "ok":
                        sock.sendall(frame(FrameType.PRODUCE, _answer(request_id)))
                    elif mode == "swap":
                        held.append(request_id)
                        if len(held) == 2:
                            for r in reversed(held):
                                sock.sendall(frame(FrameType.PRODUCE, _answer(r)))
                            held.clear()
                    elif mode == "pair":
                        held.append(request_id)
                        if len(held) == 2:
                            sock.sendall(b"".join(frame(FrameType.PRODUCE, _answer(r)) for r in held))
                    elif mode == "stray":
                        held.append(request_id)
                        if len(held) == 2:
                            sock.sendall(frame(FrameType.PRODUCE, _answer(max(held) + 100)))
                    elif mode == "end":
                        held.append(request_id)
                        if len(held) == 3:
                            sock.sendall(frame(FrameType.PRODUCE, _answer(held[0])))
                            return


def _answer(request_id: int) -> bytes:
    return pb.ProduceResponse(request_id=request_id).SerializeToString()


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


class Outcomes:
    def __init__(self, expected: int) -> None:
        self.got: list[object] = []
        self._expected = expected
        self._done = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, outcome: object) -> None:
        with self._lock:
            self.got.append(outcome)
            if len(self.got) >= self._expected:
                self._done.set()

    def wait(self) -> list[object]:
        assert self._done.wait(10), f"only {len(self.got)} of {self._expected} requests settled"
        return self.got


def _connection(peer: Peer) -> WireConnection[pb.ProduceRequest, pb.ProduceResponse]:
    return WireConnection(peer.address, FrameType.PRODUCE, pb.ProduceResponse, "test-produce")


def _one_outcome(address: str, timeout: float = 10) -> object:
    """Send one request on a new connection to ``address``; what it was settled with."""
    conn: WireConnection[pb.ProduceRequest, pb.ProduceResponse] = WireConnection(
        address, FrameType.PRODUCE, pb.ProduceResponse, "test-produce"
    )
    outcomes = Outcomes(1)
    try:
        conn.send(pb.ProduceRequest(), timeout, outcomes)
        (got,) = outcomes.wait()
    finally:
        conn.close()
    return got


def test_requests_sent_before_the_connection_is_up_are_answered_in_order(peer: Peer) -> None:
    conn = _connection(peer)
    outcomes = Outcomes(50)
    try:
        for _ in range(50):
            conn.send(pb.ProduceRequest(), 10, outcomes)
        got = outcomes.wait()
    finally:
        conn.close()
    assert [r.request_id for r in got if isinstance(r, pb.ProduceResponse)] == list(range(1, 51))
    assert peer.connections == 1


def test_answers_out_of_order_fail_every_waiting_request_and_the_next_send_reconnects(peer: Peer) -> None:
    peer.mode = "swap"
    conn = _connection(peer)
    try:
        outcomes = Outcomes(2)
        conn.send(pb.ProduceRequest(), 10, outcomes)
        conn.send(pb.ProduceRequest(), 10, outcomes)
        got = outcomes.wait()
        assert all(isinstance(o, SluiceError) for o in got), got
        assert all(isinstance(o, SluiceError) and o.retriable for o in got)
        peer.mode = "ok"
        again = Outcomes(1)
        conn.send(pb.ProduceRequest(), 10, again)
        (answer,) = again.wait()
        assert isinstance(answer, pb.ProduceResponse)
        assert peer.connections == 2
    finally:
        conn.close()


def test_a_connection_ended_by_the_peer_fails_what_it_still_owes(peer: Peer) -> None:
    peer.mode = "end"
    conn = _connection(peer)
    outcomes = Outcomes(3)
    try:
        for _ in range(3):
            conn.send(pb.ProduceRequest(), 10, outcomes)
        got = outcomes.wait()
    finally:
        conn.close()
    assert isinstance(got[0], pb.ProduceResponse)
    assert [type(o) for o in got[1:]] == [BrokerNotAvailable, BrokerNotAvailable]


def test_a_peer_that_never_answers_times_the_request_out(peer: Peer) -> None:
    peer.mode = "mute"
    got = _one_outcome(peer.address, timeout=0.3)
    assert isinstance(got, RequestTimedOut)
    assert got.retriable


def test_a_refused_hello_is_passed_on_typed(peer: Peer) -> None:
    peer.mode = "refuse"
    got = _one_outcome(peer.address)
    assert isinstance(got, Unauthenticated)
    assert "no credentials" in got.message


def test_an_unreachable_broker_fails_the_request_retriable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    assert isinstance(_one_outcome(f"127.0.0.1:{port}"), BrokerNotAvailable)


def test_send_after_close_fails_at_once(peer: Peer) -> None:
    conn = _connection(peer)
    conn.close()
    outcomes = Outcomes(1)
    conn.send(pb.ProduceRequest(), 10, outcomes)
    (got,) = outcomes.wait()
    assert isinstance(got, BrokerNotAvailable)


def test_each_connect_asks_again_where_the_broker_listens(peer: Peer) -> None:
    """A broker restarted on another wire port is found: the address is resolved per connect."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens here once closed
    where = [gone]
    conn: WireConnection[pb.ProduceRequest, pb.ProduceResponse] = WireConnection(
        lambda: where[0], FrameType.PRODUCE, pb.ProduceResponse, "test-produce"
    )
    try:
        first = Outcomes(1)
        conn.send(pb.ProduceRequest(), 10, first)
        assert isinstance(first.wait()[0], BrokerNotAvailable)
        where[0] = peer.address
        second = Outcomes(1)
        conn.send(pb.ProduceRequest(), 10, second)
        assert isinstance(second.wait()[0], pb.ProduceResponse)
    finally:
        conn.close()


def test_a_stray_answer_fails_a_followed_request_and_the_one_after_it(peer: Peer) -> None:
    """A followed request leaves the queue only for an answer in order: on a stray answer it is
    still owed its error, as every other waiting request is."""
    peer.mode = "stray"
    conn = _connection(peer)
    outcomes = Outcomes(2)

    def on_answer(outcome: object) -> bool:
        outcomes(outcome)
        return not isinstance(outcome, SluiceError)

    try:
        conn.follow(pb.ProduceRequest(), 10, on_answer)
        conn.send(pb.ProduceRequest(), 10, outcomes)
        got = outcomes.wait()
    finally:
        conn.close()
    assert len(got) == 2
    assert all(isinstance(o, BrokerNotAvailable) and o.retriable for o in got), got


def test_answers_read_after_close_are_dropped_quietly(peer: Peer, caplog: pytest.LogCaptureFixture) -> None:
    """``sluice track`` and the Spark source close their fetcher while a pipelined fetch's answer is
    on its way. ``close()`` fails what the connection owed; an answer the reader already holds then
    belongs to nobody and must not pass for a broker breaking the protocol ("answer to request 2
    arrived, expected none; reconnecting"). Here the first answer's callback closes the connection
    while the second answer sits in the same read: the race, made deterministic."""
    peer.mode = "pair"
    conn = _connection(peer)
    outcomes = Outcomes(2)

    def first(outcome: object) -> None:
        outcomes(outcome)
        conn.close()

    conn.send(pb.ProduceRequest(), 10, first)
    conn.send(pb.ProduceRequest(), 10, outcomes)
    got = outcomes.wait()
    assert isinstance(got[0], pb.ProduceResponse)
    assert isinstance(got[1], BrokerNotAvailable)  # failed once, by close(), never answered twice
    assert "closed" in got[1].message
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
