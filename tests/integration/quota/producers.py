"""Producers for the quota tests that never wait for a throttle time: they show what the broker
itself enforces (docs/quotas.md). Each runs for a given time and returns its answers' times."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc

from sluice.common.wire import HEADER, FrameReader, FrameType
from sluice.v1 import broker_pb2 as pb
from sluice.v1 import broker_pb2_grpc, common_pb2, wire_pb2


@dataclass
class Answers:
    """(monotonic time answered, record bytes, throttle_time_ms) per acknowledged produce."""

    rows: list[tuple[float, int, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, answer: pb.ProduceResponse, size: int) -> None:
        if answer.error.code != common_pb2.NONE or any(p.error.code for p in answer.partitions):
            self.errors.append(str(answer))
        self.rows.append((time.monotonic(), size, answer.throttle_time_ms))

    def rate(self, start: float, end: float) -> float:
        """Bytes per second acknowledged within [start, end]."""
        return sum(size for at, size, _ in self.rows if start <= at < end) / (end - start)

    @property
    def throttled(self) -> int:
        return sum(1 for _, _, ms in self.rows if ms > 0)


def produce_request(topic: str, partition: int, batch: bytes, request_id: int) -> pb.ProduceRequest:
    request = pb.ProduceRequest(acks=1, timeout_ms=30_000, request_id=request_id)
    request.partitions.add(topic=topic, partition=partition, records=batch)
    return request


def wire_producer(
    address: str,
    client_id: str,
    topic: str,
    partition: int,
    batch: bytes,
    seconds: float,
    window: int,
    metadata: dict[str, str] | None = None,
) -> Answers:
    """Pipelines produce frames (``window`` unanswered at most) for ``seconds`` over the wire, reading
    the answers only to count them: it never waits for a throttle time. ``metadata``: the hello's
    credentials."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    answers = Answers()
    try:
        hello = wire_pb2.WireHello(version=1, client_id=client_id, metadata=metadata).SerializeToString()
        sock.sendall(HEADER.pack(len(hello) + 1, FrameType.HELLO) + hello)
        reader = FrameReader()
        frames: list[tuple[int, bytes]] = []

        def next_frame() -> tuple[int, bytes]:
            while not frames:
                data = sock.recv(1 << 20)
                assert data, "the broker closed the connection"
                frames.extend((k, bytes(p)) for k, p in reader.feed(data))
            return frames.pop(0)

        assert next_frame()[0] == FrameType.HELLO
        slots = threading.Semaphore(window)
        sent = [0]
        done = [False]
        changed = threading.Condition()
        end = time.monotonic() + seconds

        def send() -> None:
            try:
                while time.monotonic() < end:
                    if not slots.acquire(timeout=1):
                        continue
                    payload = produce_request(topic, partition, batch, sent[0]).SerializeToString()
                    sock.sendall(HEADER.pack(len(payload) + 1, FrameType.PRODUCE) + payload)
                    with changed:
                        sent[0] += 1
                        changed.notify()
            finally:
                with changed:
                    done[0] = True
                    changed.notify()

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        got = [0]  # answers received
        give_up = end + 60
        while time.monotonic() < give_up:
            # Read only with an answer owed: the sender may stop at any moment.
            with changed:
                changed.wait_for(lambda: got[0] < sent[0] or done[0], timeout=give_up - time.monotonic())
                if got[0] >= sent[0]:
                    break  # the sender is done and everything is answered
            kind, payload = next_frame()
            assert kind == FrameType.PRODUCE, (kind, payload)
            answers.add(pb.ProduceResponse.FromString(payload), len(batch))
            got[0] += 1
            slots.release()
        sender.join(10)
    finally:
        sock.close()
    return answers


def grpc_producer(
    address: str, client_id: str, topic: str, partition: int, batch: bytes, seconds: float
) -> Answers:
    """A raw ProduceStream that sends as fast as HTTP/2 lets it, ignoring throttle times."""
    answers = Answers()
    end = time.monotonic() + seconds

    def requests() -> Iterator[pb.ProduceRequest]:
        i = 0
        while time.monotonic() < end:
            yield produce_request(topic, partition, batch, i)
            i += 1

    with grpc.insecure_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        for answer in stub.ProduceStream(
            requests(), metadata=(("sluice-client-id", client_id),), timeout=120
        ):
            answers.add(answer, len(batch))
    return answers


def fill(address: str, topic: str, partition: int, batch: bytes, count: int) -> None:
    """Produce ``count`` batches (as an unlimited client), 16 in flight."""
    answers = wire_producer_count(address, "filler", topic, partition, batch, count)
    assert not answers.errors, answers.errors[:3]


def wire_producer_count(
    address: str, client_id: str, topic: str, partition: int, batch: bytes, count: int
) -> Answers:
    host, _, port = address.rpartition(":")
    answers = Answers()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        hello = wire_pb2.WireHello(version=1, client_id=client_id).SerializeToString()
        sock.sendall(HEADER.pack(len(hello) + 1, FrameType.HELLO) + hello)
        frames = _frames(sock)
        assert next(frames)[0] == FrameType.HELLO
        for i in range(count):
            payload = produce_request(topic, partition, batch, i).SerializeToString()
            sock.sendall(HEADER.pack(len(payload) + 1, FrameType.PRODUCE) + payload)
            if i >= 16:
                answers.add(pb.ProduceResponse.FromString(next(frames)[1]), len(batch))
        while len(answers.rows) < count:
            answers.add(pb.ProduceResponse.FromString(next(frames)[1]), len(batch))
    return answers


def _frames(sock: socket.socket) -> Iterator[tuple[int, bytes]]:
    reader = FrameReader()
    while True:
        data = sock.recv(1 << 20)
        assert data, "the broker closed the connection"
        for kind, payload in reader.feed(data):
            yield kind, bytes(payload)


def wire_fetcher(
    address: str, client_id: str, topic: str, seconds: float, *, continuous: bool, max_bytes: int
) -> list[tuple[float, int, int]]:
    """Fetches partition 0 from offset 0 for ``seconds``, never waiting for a throttle time: one
    continuous fetch, or a new fetch as soon as each answer came. Returns (time, record bytes,
    throttle_time_ms) per answer."""
    host, _, port = address.rpartition(":")
    rows: list[tuple[float, int, int]] = []
    end = time.monotonic() + seconds

    def request(offset: int) -> bytes:
        req = pb.FetchRequest(
            max_wait_ms=500, min_bytes=1, max_bytes=max_bytes, session_epoch=-1, continuous=continuous
        )
        req.partitions.add(topic=topic, partition=0, fetch_offset=offset, partition_max_bytes=max_bytes)
        payload = req.SerializeToString()
        return HEADER.pack(len(payload) + 1, FrameType.FETCH) + payload

    with socket.create_connection((host, int(port)), timeout=60) as sock:
        hello = wire_pb2.WireHello(version=1, client_id=client_id).SerializeToString()
        sock.sendall(HEADER.pack(len(hello) + 1, FrameType.HELLO) + hello)
        frames = _frames(sock)
        assert next(frames)[0] == FrameType.HELLO
        sock.sendall(request(0))
        while time.monotonic() < end:
            kind, payload = next(frames)
            assert kind == FrameType.FETCH, (kind, payload)
            answer = pb.FetchResponse.FromString(payload)
            assert not answer.error.code, answer.error
            part = answer.partitions[0]
            assert not part.error.code, part.error
            rows.append((time.monotonic(), len(part.records), answer.throttle_time_ms))
            if not continuous:
                sock.sendall(request(part.next_offset))
    return rows
