"""Broker.ProduceStream and Broker.FetchStream: many requests over one call, answered in order.

Against a real broker process; the SDK's side (``client.streams.RequestStream``) is driven
through its public ``send``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import grpc

from sluice.client.streams import RequestStream
from sluice.errors import BrokerNotAvailable, RequestTimedOut, SluiceError
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import broker_pb2_grpc, common_pb2
from tests.harness import free_port

from .conftest import Broker, make_batch, part, records, start_broker, vals

T = TypeVar("T")


def _requests(q: queue.SimpleQueue[T | None]) -> Iterator[T]:
    while (item := q.get()) is not None:
        yield item


def _produce(topic: str, values: list[bytes], request_id: int, acks: int = 1) -> pb.ProduceRequest:
    request = pb.ProduceRequest(acks=acks, timeout_ms=5000, request_id=request_id)
    request.partitions.add(topic=topic, partition=0, records=make_batch(values))
    return request


def test_produce_stream_pipelines_and_answers_in_order(broker: Broker, topic: str) -> None:
    """Twenty requests sent before reading any answer: appended in stream order (dense offsets),
    answered in that order, each with its own request_id; a refused request in the middle gets
    its typed error in its answer and the stream goes on."""
    broker.assign(topic)
    sent: queue.SimpleQueue[pb.ProduceRequest | None] = queue.SimpleQueue()
    for i in range(20):
        sent.put(_produce(topic, vals(3, f"r{i}-"), request_id=100 + i))
        if i == 10:
            sent.put(pb.ProduceRequest(acks=1, request_id=555))  # names no partitions
    sent.put(None)
    answers = list(broker.stub.ProduceStream(_requests(sent), timeout=30))
    assert [a.request_id for a in answers] == [100 + i for i in range(11)] + [555] + [
        100 + i for i in range(11, 20)
    ]
    refused = answers[11]
    assert refused.error.code == common_pb2.INVALID_REQUEST
    assert not refused.partitions
    ok = [a for a in answers if a.request_id != 555]
    assert all(a.error.code == common_pb2.NONE for a in ok)
    assert [a.partitions[0].base_offset for a in ok] == [3 * i for i in range(20)]
    got = records(broker.fetch_one(topic, 0))
    assert [r.value for r in got] == [f"r{i}-{j}".encode() for i in range(20) for j in range(3)]
    # Each stream message is counted as a Produce request, as a unary call would be.
    assert (broker.metric("sluice_broker_rpc_requests_total", method="Produce", code="OK") or 0) >= 20
    assert (
        broker.metric("sluice_broker_rpc_requests_total", method="Produce", code="INVALID_REQUEST") or 0
    ) >= 1


def test_produce_stream_under_flush_always_acks_after_fsync(tmp_path: Path, topic: str) -> None:
    b = start_broker(tmp_path / "data", flush="always")
    try:
        b.assign(topic)
        sent: queue.SimpleQueue[pb.ProduceRequest | None] = queue.SimpleQueue()
        for i in range(30):
            sent.put(_produce(topic, vals(2, f"a{i}-"), request_id=i + 1))
        sent.put(None)
        answers = list(b.stub.ProduceStream(_requests(sent), timeout=30))
        assert [a.request_id for a in answers] == list(range(1, 31))
        assert [a.partitions[0].base_offset for a in answers] == [2 * i for i in range(30)]
        # Every answer waited for an fsync (group commits: fewer fsyncs than requests is fine).
        assert (b.metric("sluice_broker_produce_flush_seconds_count") or 0) >= 30
    finally:
        b.stop()


def test_fetch_stream_long_polls_and_reports_errors_per_request(broker: Broker, topic: str) -> None:
    broker.assign(topic)
    sent: queue.SimpleQueue[pb.FetchRequest | None] = queue.SimpleQueue()
    answers = iter(broker.stub.FetchStream(_requests(sent), timeout=30))
    sent.put(pb.FetchRequest(max_wait_ms=3_600_000, session_epoch=-1, request_id=1))  # over the cap
    first = next(answers)
    assert (first.request_id, first.error.code) == (1, common_pb2.INVALID_ARGUMENT)
    # The stream is still usable: a long-poll parks until a produce arrives.
    sent.put(
        pb.FetchRequest(
            max_wait_ms=4_000, min_bytes=1, session_epoch=-1, partitions=[part(topic)], request_id=2
        )
    )
    started = time.monotonic()
    threading.Timer(0.3, lambda: broker.produce(topic, 0, make_batch(vals(4)))).start()
    second = next(answers)
    assert second.request_id == 2
    assert 0.2 < time.monotonic() - started < 5
    assert [r.value for r in records(second.partitions[0])] == vals(4)
    sent.put(None)
    assert list(answers) == []


def _wait(results: queue.SimpleQueue[object]) -> object:
    return results.get(timeout=20)


def test_request_stream_matches_answers_and_survives_a_broker_restart(tmp_path: Path, topic: str) -> None:
    port = str(free_port())  # the restarted broker comes back on the same address
    b = start_broker(tmp_path / "data", "--port", port)
    try:
        b.assign(topic)
        stream = RequestStream(b.stub.ProduceStream, "produce-test")
        results: queue.SimpleQueue[object] = queue.SimpleQueue()
        for i in range(5):
            stream.send(_produce(topic, vals(1, f"x{i}"), request_id=0), 10, results.put)
        answers = [_wait(results) for _ in range(5)]
        assert all(isinstance(a, pb.ProduceResponse) for a in answers)
        assert [a.partitions[0].base_offset for a in answers if isinstance(a, pb.ProduceResponse)] == list(
            range(5)
        )

        # A refused request comes back as the broker's typed error, on a working stream.
        stream.send(_produce(topic, vals(1), request_id=0, acks=7), 10, results.put)
        refused = _wait(results)
        assert isinstance(refused, pb.ProduceResponse)
        assert refused.error.code == common_pb2.INVALID_ARGUMENT

        # The broker dies: what is in flight fails typed; the next send opens a new call.
        b.kill()
        stream.send(_produce(topic, vals(1, "lost"), request_id=0), 10, results.put)
        failed = _wait(results)
        assert isinstance(failed, SluiceError)
        assert failed.retriable
        b = start_broker(tmp_path / "data", "--port", port)
        # gRPC shares the subchannel to this address, still backing off from the refused connects.
        b.channel.close()
        b.channel = grpc.insecure_channel(b.proc.address, options=(("grpc.use_local_subchannel_pool", 1),))
        b.stub = broker_pb2_grpc.BrokerStub(b.channel)
        b.assign(topic)
        deadline = time.monotonic() + 20
        while True:
            stream.send(_produce(topic, vals(1, "again"), request_id=0), 10, results.put)
            outcome = _wait(results)
            if isinstance(outcome, pb.ProduceResponse) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert isinstance(outcome, pb.ProduceResponse), outcome
        assert outcome.partitions[0].base_offset == 5
        stream.close()
        stream.send(_produce(topic, vals(1), request_id=0), 10, results.put)
        assert isinstance(_wait(results), BrokerNotAvailable)
    finally:
        b.stop()


def test_request_stream_times_out_an_unanswered_request_and_recovers(broker: Broker, topic: str) -> None:
    """A fetch parked longer than the client's timeout: the stream is cancelled, the request fails
    with RequestTimedOut, and the next request works on a new call."""
    broker.assign(topic)
    stream = RequestStream(broker.stub.FetchStream, "fetch-test")
    results: queue.SimpleQueue[object] = queue.SimpleQueue()
    parked = pb.FetchRequest(max_wait_ms=4_000, min_bytes=1, session_epoch=-1, partitions=[part(topic)])
    started = time.monotonic()
    stream.send(parked, 0.5, results.put)
    outcome = _wait(results)
    assert isinstance(outcome, RequestTimedOut), outcome
    assert time.monotonic() - started < 10
    broker.produce(topic, 0, make_batch(vals(2)))
    stream.send(pb.FetchRequest(session_epoch=-1, partitions=[part(topic)]), 10, results.put)
    answer = _wait(results)
    assert isinstance(answer, pb.FetchResponse)
    assert [r.value for r in records(answer.partitions[0])] == vals(2)
    stream.close()
