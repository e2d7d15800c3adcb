"""RequestStream against a peer that breaks the stream contract (answers out of order, or ends the
stream early): every waiting request fails typed and retriable, and the next send opens a new call.

The peer is a real gRPC server on loopback speaking the broker's ProduceStream messages; a
misbehaving peer is the only way to reach these paths (the broker itself never does this).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from sluice.client.streams import RequestStream
from sluice.errors import BrokerNotAvailable
from sluice.v1 import broker_pb2 as pb

METHOD = "/sluice.v1.Broker/ProduceStream"


class Peer:
    """Answers ProduceStream requests; ``mode`` says how (changed between calls by the test)."""

    def __init__(self) -> None:
        self.mode = (
            # "swap": answer pairs in reverse order; "end": end after answering one of three; "ok";
            # "pair": answer pairs in order
            "swap"
        )
        self.calls = 0
        self._lock = threading.Lock()

    def handle(
        self, requests: Iterator[pb.ProduceRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.ProduceResponse]:
        with self._lock:
            self.calls += 1
            mode = self.mode
        held: list[pb.ProduceRequest] = []
        for request in requests:
            if mode == "ok":
                yield pb.ProduceResponse(request_id=request.request_id)
            elif mode == "pair":  # two requests read, both answered in order
                held.append(request)
                if len(held) == 2:
                    for r in held:
                        yield pb.ProduceResponse(request_id=r.request_id)
                    held.clear()
            elif mode == "end":  # three requests read, one answered, then the stream ends
                held.append(request)
                if len(held) == 3:
                    yield pb.ProduceResponse(request_id=held[0].request_id)
                    return
            else:
                held.append(request)
                if len(held) == 2:
                    for r in reversed(held):
                        yield pb.ProduceResponse(request_id=r.request_id)
                    held.clear()


@pytest.fixture
def peer() -> Iterator[tuple[Peer, grpc.Channel]]:
    p = Peer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.stream_stream_rpc_method_handler(
        p.handle,
        request_deserializer=pb.ProduceRequest.FromString,
        response_serializer=pb.ProduceResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("sluice.v1.Broker", {"ProduceStream": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield p, channel
    finally:
        channel.close()
        server.stop(None)


def _stream(channel: grpc.Channel) -> RequestStream[pb.ProduceRequest, pb.ProduceResponse]:
    call = channel.stream_stream(
        METHOD,
        request_serializer=pb.ProduceRequest.SerializeToString,
        response_deserializer=pb.ProduceResponse.FromString,
    )
    return RequestStream(call, "test")


def test_answers_out_of_order_fail_every_waiting_request_and_the_stream_reopens(
    peer: tuple[Peer, grpc.Channel],
) -> None:
    p, channel = peer
    stream = _stream(channel)
    results: queue.SimpleQueue[object] = queue.SimpleQueue()
    stream.send(pb.ProduceRequest(), 10, results.put)
    stream.send(pb.ProduceRequest(), 10, results.put)
    outcomes = [results.get(timeout=10), results.get(timeout=10)]
    assert all(isinstance(o, BrokerNotAvailable) for o in outcomes), outcomes
    assert all(o.retriable for o in outcomes if isinstance(o, BrokerNotAvailable))
    p.mode = "ok"
    stream.send(pb.ProduceRequest(), 10, results.put)
    answer = results.get(timeout=10)
    assert isinstance(answer, pb.ProduceResponse)
    assert answer.request_id == 3  # ids keep counting across calls
    assert p.calls == 2  # a new call, not the broken one
    stream.close()


def test_a_stream_ended_by_the_peer_fails_what_it_still_owes(peer: tuple[Peer, grpc.Channel]) -> None:
    p, channel = peer
    p.mode = "end"
    stream = _stream(channel)
    results: queue.SimpleQueue[object] = queue.SimpleQueue()
    for _ in range(3):
        stream.send(pb.ProduceRequest(), 10, results.put)
    outcomes = [results.get(timeout=10) for _ in range(3)]
    assert isinstance(outcomes[0], pb.ProduceResponse)
    assert all(isinstance(o, BrokerNotAvailable) for o in outcomes[1:]), outcomes
    stream.close()


def test_an_answer_arriving_after_close_is_dropped_quietly(
    peer: tuple[Peer, grpc.Channel], caplog: pytest.LogCaptureFixture
) -> None:
    """The first answer's callback closes the stream while the second answer is on its way: the
    second request is failed once, by close(), and its answer is no "answer to request 2 arrived,
    expected none" error."""
    p, channel = peer
    p.mode = "pair"
    stream = _stream(channel)
    results: queue.SimpleQueue[object] = queue.SimpleQueue()

    def first(outcome: object) -> None:
        results.put(outcome)
        stream.close()

    stream.send(pb.ProduceRequest(), 10, first)
    stream.send(pb.ProduceRequest(), 10, results.put)
    outcomes = [results.get(timeout=10), results.get(timeout=10)]
    assert isinstance(outcomes[0], pb.ProduceResponse)
    assert isinstance(outcomes[1], BrokerNotAvailable)
    assert results.empty()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
