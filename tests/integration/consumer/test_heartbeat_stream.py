"""The heartbeat stream (ConsumerGroupStream) end to end: pushed rebalances, the unary fallback, bad
messages, and a closed stream that is not a leave."""

from __future__ import annotations

import queue
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from typing import Any, cast

import grpc
import pytest

from sluice.client.consumer import Consumer
from sluice.v1 import common_pb2, coordinator_pb2, coordinator_pb2_grpc
from tests.integration.consumer.conftest import Cluster

_STREAM = "/sluice.v1.Coordinator/ConsumerGroupStream"


class RawStream:
    """One ConsumerGroupStream driven message by message, as a test needs it."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.requests: queue.SimpleQueue[coordinator_pb2.GroupStreamRequest | None] = queue.SimpleQueue()
        self.messages: queue.SimpleQueue[coordinator_pb2.GroupStreamResponse] = queue.SimpleQueue()
        stub = coordinator_pb2_grpc.CoordinatorStub(self.channel)
        self.call = stub.ConsumerGroupStream(iter(self.requests.get, None))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self.messages.put(message)
        except grpc.RpcError:
            pass

    def send(self, request: coordinator_pb2.GroupStreamRequest) -> None:
        self.requests.put(request)

    def next(self, kind: str, timeout: float = 10.0) -> Any:
        """The next message of ``kind`` (``heartbeat`` or ``heartbeat_now``); others are skipped."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.messages.get(timeout=max(0.01, deadline - time.monotonic()))
            if message.WhichOneof("kind") == kind:
                return getattr(message, kind)

    def heartbeat(self, **fields: Any) -> coordinator_pb2.GroupHeartbeatResponse:
        self.send(
            coordinator_pb2.GroupStreamRequest(heartbeat=coordinator_pb2.GroupHeartbeatRequest(**fields))
        )
        response: coordinator_pb2.GroupHeartbeatResponse = self.next("heartbeat")
        return response

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()
        self.channel.close()


@pytest.fixture
def streams(cluster: Cluster) -> Iterator[list[RawStream]]:
    opened: list[RawStream] = []
    yield opened
    for s in opened:
        s.close()


def heartbeats_counted(cluster: Cluster, code: str) -> float:
    """``sluice_coordinator_rpc_requests_total{method="Heartbeat",code=...}`` from /metrics."""
    with urllib.request.urlopen(f"http://{cluster.coordinator.metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    pattern = rf'^sluice_coordinator_rpc_requests_total{{code="{code}",method="Heartbeat"}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def owned_of(response: coordinator_pb2.GroupHeartbeatResponse) -> list[common_pb2.TopicPartition]:
    return [
        common_pb2.TopicPartition(topic=a.topic, partition=a.partition)
        for a in response.assignment.partitions
    ]


def test_bad_messages_are_answered_with_errors_and_the_stream_stays_open(
    cluster: Cluster, streams: list[RawStream]
) -> None:
    topic = cluster.topic(2)
    ok_before = heartbeats_counted(cluster, "OK")
    s = RawStream(cluster.bootstrap)
    streams.append(s)
    s.send(coordinator_pb2.GroupStreamRequest())  # no heartbeat at all
    assert s.next("heartbeat").error.code == common_pb2.INVALID_REQUEST
    assert s.heartbeat(group="bad group name!", subscription={topic: "*"}).error.code != common_pb2.NONE
    assert (
        s.heartbeat(group="g-bad", member_epoch=-7, subscription={topic: "*"}).error.code != common_pb2.NONE
    )
    refused = s.heartbeat(group="g-bad", subscription={"no-such-topic": "*"})
    assert refused.error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
    joined = s.heartbeat(group="g-bad", subscription={topic: "*"})
    assert joined.error.code == common_pb2.NONE
    assert joined.member_epoch > 0
    assert len(joined.assignment.partitions) == 2
    # Every message is counted as a Heartbeat request, as the unary RPC would be: the refusal in the
    # answer and the join as OK, the malformed ones under their error codes.
    assert heartbeats_counted(cluster, "OK") - ok_before >= 2
    assert heartbeats_counted(cluster, "INVALID_REQUEST") >= 1


def test_closing_the_stream_is_not_leaving(cluster: Cluster, streams: list[RawStream]) -> None:
    topic = cluster.topic(2)
    first = RawStream(cluster.bootstrap)
    streams.append(first)
    joined = first.heartbeat(group="g-close", subscription={topic: "*"}, session_timeout_ms=1500)
    first.close()
    time.sleep(0.5)
    admin = cluster.client().admin
    assert [m.member_id for m in admin.describe_group("g-close").members] == [joined.member_id]
    # The member carries on over a new stream with the same id and epoch.
    second = RawStream(cluster.bootstrap)
    streams.append(second)
    again = second.heartbeat(
        group="g-close",
        member_id=joined.member_id,
        member_epoch=joined.member_epoch,
        subscription={topic: "*"},
        owned=owned_of(joined),
        session_timeout_ms=1500,
    )
    assert again.error.code == common_pb2.NONE
    assert again.member_epoch == joined.member_epoch
    # Silent past its session timeout (stream open or not), it is removed.
    time.sleep(2.5)
    late = second.heartbeat(
        group="g-close",
        member_id=joined.member_id,
        member_epoch=joined.member_epoch,
        subscription={topic: "*"},
        owned=owned_of(joined),
    )
    assert late.error.code == common_pb2.UNKNOWN_MEMBER


def test_a_join_pushes_heartbeat_now_to_the_member_that_must_give_up_partitions(
    cluster: Cluster, streams: list[RawStream]
) -> None:
    topic = cluster.topic(4)
    a = RawStream(cluster.bootstrap)
    streams.append(a)
    a_joined = a.heartbeat(group="g-push", subscription={topic: "*"})
    assert len(a_joined.assignment.partitions) == 4
    b = RawStream(cluster.bootstrap)
    streams.append(b)
    b_joined = b.heartbeat(group="g-push", subscription={topic: "*"})
    assert not b_joined.assignment.partitions  # a still holds everything
    a.next("heartbeat_now", timeout=2.0)  # a's target changed: told at once, not at its next interval
    a_told = a.heartbeat(
        group="g-push",
        member_id=a_joined.member_id,
        member_epoch=a_joined.member_epoch,
        subscription={topic: "*"},
        owned=owned_of(a_joined),
    )
    kept = owned_of(a_told)
    assert len(kept) == 2
    a.heartbeat(  # released: b waits for exactly these, so b is told next
        group="g-push",
        member_id=a_told.member_id,
        member_epoch=a_told.member_epoch,
        subscription={topic: "*"},
        owned=kept,
    )
    b.next("heartbeat_now", timeout=2.0)
    b_gets = b.heartbeat(
        group="g-push",
        member_id=b_joined.member_id,
        member_epoch=b_joined.member_epoch,
        subscription={topic: "*"},
    )
    assert len(b_gets.assignment.partitions) == 2


def poll_in_background(consumer: Consumer, stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            consumer.poll(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_sdk_members_rebalance_without_waiting_for_the_heartbeat_interval(cluster: Cluster) -> None:
    """With a 20 s heartbeat interval, a join still completes in well under a second: the coordinator
    pushes heartbeat_now to the member that must release, and then to the one waiting."""
    topic = cluster.topic(4)
    client = cluster.client()
    client.admin.set_group_config("g-sdk-push", heartbeat_interval="20s", session_timeout="60s")
    stop = threading.Event()
    a = client.consumer("g-sdk-push", [topic], auto_offset_reset="earliest")
    threads = [poll_in_background(a, stop)]
    try:
        deadline = time.monotonic() + 10
        while len(a.assignment()) < 4:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        started = time.monotonic()
        b = client.consumer("g-sdk-push", [topic], auto_offset_reset="earliest")
        threads.append(poll_in_background(b, stop))
        while not (len(a.assignment()) == 2 and len(b.assignment()) == 2):
            assert time.monotonic() - started < 5, (a.assignment(), b.assignment())
            time.sleep(0.01)
        took = time.monotonic() - started
        assert took < 2.0, took
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        a.close()
        if len(threads) > 1:
            b.close()


class UnaryOnlyProxy(grpc.GenericRpcHandler):  # type: ignore[type-arg]  # generic in grpc-stubs only
    """A coordinator of a release without the stream: forwards every unary Coordinator call to the real
    one and answers ConsumerGroupStream with UNIMPLEMENTED (no handler)."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.streams_refused = 0

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = details.method
        if method == _STREAM:
            self.streams_refused += 1
            return None
        forward: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self.channel.unary_unary(
            method, request_serializer=None, response_deserializer=None
        )

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                return forward(request, timeout=10, metadata=context.invocation_metadata())
            except grpc.RpcError as exc:
                # grpc-stubs types RpcError's trailers as `_Metadatum` objects; a failed call
                # really returns the (key, value) pairs that set_trailing_metadata takes.
                context.set_trailing_metadata(cast("grpc.Metadata", exc.trailing_metadata() or ()))
                context.abort(exc.code(), exc.details() or "")

        return grpc.unary_unary_rpc_method_handler(handle)


def test_the_sdk_falls_back_to_unary_heartbeats(cluster: Cluster) -> None:
    topic = cluster.topic(2)
    with cluster.client() as producing, producing.producer(topic) as p:
        for i in range(10):
            p.send(b"%d" % i)
    proxy = UnaryOnlyProxy(cluster.bootstrap)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((proxy,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        from sluice import Client

        with Client(f"127.0.0.1:{port}", request_timeout=10.0) as client:
            consumer = client.consumer("g-unary", [topic], auto_offset_reset="earliest")
            seen: list[bytes] = []
            deadline = time.monotonic() + 10
            while len(seen) < 10 and time.monotonic() < deadline:
                seen.extend(r.value for r in consumer.poll(0.2))
            assert sorted(seen) == sorted(b"%d" % i for i in range(10))
            assert proxy.streams_refused == 1  # tried once, then unary only
            consumer.close()
    finally:
        server.stop(None)
        proxy.channel.close()


def test_a_coordinator_stops_at_once_with_streams_open(own_cluster: Cluster) -> None:
    """Open streams are ended at shutdown: the server's graceful stop does not wait them out, and the
    members see the stream end (and reconnect) instead of a hang."""
    topic = own_cluster.topic(2)
    s = RawStream(own_cluster.bootstrap)
    try:
        assert s.heartbeat(group="g-stop", subscription={topic: "*"}).error.code == common_pb2.NONE
        started = time.monotonic()
        own_cluster.coordinator.terminate()
        assert time.monotonic() - started < 4.0
        s.reader.join(5)
        assert not s.reader.is_alive()
    finally:
        s.close()
