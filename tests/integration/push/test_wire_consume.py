"""A push subscription over the dispatcher's wire port (docs/wire.md): one Consume stream per
connection, with exactly the gRPC stream's semantics, and protocol errors that end only the
offending connection."""

from __future__ import annotations

import pytest

from sluice import Client
from sluice.client.links import TRANSPORT_ENV
from sluice.common.wire import FrameType, frame
from sluice.v1 import common_pb2
from sluice.v1 import dispatcher_pb2 as dpb
from tests.integration.push.conftest import PushCluster
from tests.integration.push.helpers import drain, produce
from tests.wire_client import RawWire, settle_connections, wire_address, wire_connections


def _wire(cluster: PushCluster) -> RawWire:
    return RawWire(wire_address(cluster.dispatcher.output))


def _event(conn: RawWire) -> dpb.DispatcherEvent:
    return dpb.DispatcherEvent.FromString(conn.answer(FrameType.CONSUME))


def _command(conn: RawWire, command: dpb.ConsumerCommand) -> None:
    conn.send(FrameType.CONSUME, command.SerializeToString())


def test_subscribe_receive_and_ack_over_a_raw_connection(
    cluster: PushCluster, client: Client, topic: str
) -> None:
    produce(client, topic, 8)
    conn = _wire(cluster)
    try:
        conn.hello()
        subscribe = dpb.Subscribe(
            topic=topic,
            subscription="raw",
            type=dpb.SUBSCRIPTION_TYPE_SHARED,
            consumer_id="raw-1",
            consumer_name="raw",
            initial_position=dpb.INITIAL_POSITION_EARLIEST,
        )
        _command(conn, dpb.ConsumerCommand(subscribe=subscribe))
        first = _event(conn)
        assert first.WhichOneof("event") == "subscribed", first
        _command(conn, dpb.ConsumerCommand(flow=dpb.Flow(permits=100)))
        got: list[dpb.PushedMessage] = []
        while len(got) < 8:
            event = _event(conn)
            if event.WhichOneof("event") == "messages":
                got += event.messages.messages
        assert sorted(int(m.value) for m in got) == list(range(8))
        ack = dpb.Ack(ids=[m.id for m in got])
        _command(conn, dpb.ConsumerCommand(ack=ack))
        # A bad command is answered with an error event, and the stream goes on.
        _command(conn, dpb.ConsumerCommand(flow=dpb.Flow(permits=0)))
        error = _event(conn)
        assert error.WhichOneof("event") == "error"
        assert error.error.code == common_pb2.INVALID_PERMITS
        produce(client, topic, 1)
        event = _event(conn)
        assert event.WhichOneof("event") == "messages", event
        assert [m.value for m in event.messages.messages] == [b"0"]
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("frames", "message"),
    [
        ([frame(FrameType.CONSUME, b"")], "the first frame must be a hello"),
        ([None, frame(FrameType.PRODUCE, b"")], "unknown frame type 2"),
        ([None, frame(FrameType.CONSUME, b"\x0a\xff")], "not a valid ConsumerCommand"),
    ],
    ids=["consume-before-hello", "broker-frame", "garbled-command"],
)
def test_a_broken_frame_ends_only_its_connection(
    cluster: PushCluster, client: Client, topic: str, frames: list[bytes | None], message: str
) -> None:
    conn = _wire(cluster)
    try:
        for f in frames:
            if f is None:
                conn.hello()
            else:
                conn.sock.sendall(f)
        error = conn.closed_with_error()
        assert error.code == common_pb2.INVALID_REQUEST
        assert message in error.message
    finally:
        conn.close()
    produce(client, topic, 3)
    with client.push_consumer(topic, "after", "shared", initial_position="earliest") as pc:
        assert sorted(int(m.value) for m in drain(pc, 3)) == [0, 1, 2]


def test_the_sdk_consumes_over_the_wire_unless_told_to_use_grpc(
    cluster: PushCluster, client: Client, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = cluster.dispatcher.metrics
    produce(client, topic, 4)
    settle_connections(metrics, "dispatcher", 0)  # every earlier test's consumer is gone
    with client.push_consumer(topic, "w", "shared", initial_position="earliest") as pc:
        assert sorted(int(m.value) for m in drain(pc, 4)) == [0, 1, 2, 3]
        settle_connections(metrics, "dispatcher", 1)
    settle_connections(metrics, "dispatcher", 0)
    monkeypatch.setenv(TRANSPORT_ENV, "grpc")
    with client.push_consumer(topic, "g", "shared", initial_position="earliest") as pc:
        assert sorted(int(m.value) for m in drain(pc, 4)) == [0, 1, 2, 3]
        assert wire_connections(metrics, "dispatcher") == 0
