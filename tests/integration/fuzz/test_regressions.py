"""The inputs the fuzz suite found that got an untyped answer or a traceback, each pinned as a plain test."""

from __future__ import annotations

import socket
from typing import Any

import grpc
import pytest

from sluice.common.rpc import ERROR_CODE_KEY
from sluice.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    dispatcher_pb2,
)
from tests.integration.push.conftest import PushCluster
from tests.wire_client import RawWire, wire_address


def _code(exc: Any) -> int:
    return int(dict(exc.trailing_metadata())[ERROR_CODE_KEY])


@pytest.mark.parametrize(
    ("service", "path"),
    [("coordinator", "/sluice.v1.Coordinator/BrokerHeartbeat"), ("broker", "/sluice.v1.Broker/Fetch")],
)
def test_bytes_that_are_not_the_request_are_invalid_argument(
    healthy_after: PushCluster, service: str, path: str
) -> None:
    """Was UNKNOWN with grpcio's traceback in the log, per call."""
    sp = healthy_after.coordinator if service == "coordinator" else healthy_after.broker
    with grpc.insecure_channel(sp.address) as ch, pytest.raises(grpc.RpcError) as info:
        ch.unary_unary(path, None, None)(b"\xff\xff", timeout=10)
    exc: Any = info.value
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(exc) == common_pb2.INVALID_ARGUMENT
    assert "is not a valid" in exc.details()


def test_bytes_on_a_stream_end_it_invalid_argument(healthy_after: PushCluster) -> None:
    with grpc.insecure_channel(healthy_after.broker.address) as ch:
        call = ch.stream_stream("/sluice.v1.Broker/ProduceStream", None, None)(
            iter([b"\x0a\xff"]), timeout=10
        )
        with pytest.raises(grpc.RpcError) as info:
            list(call)
    exc: Any = info.value
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _code(exc) == common_pb2.INVALID_ARGUMENT


def test_a_garbled_first_consume_command_gets_an_error_event(healthy_after: PushCluster) -> None:
    """As on the wire port: a typed error event, then the stream ends."""
    with grpc.insecure_channel(healthy_after.dispatcher.address) as ch:
        call = ch.stream_stream("/sluice.v1.Dispatcher/Consume", None, None)(iter([b"\x0a\xff"]), timeout=10)
        events = [dispatcher_pb2.DispatcherEvent.FromString(raw) for raw in call]
    assert [e.WhichOneof("event") for e in events] == ["error"], events
    assert events[0].error.code == common_pb2.INVALID_REQUEST
    assert "not a valid ConsumerCommand" in events[0].error.message


def test_an_error_echoing_a_huge_name_still_arrives_typed(healthy_after: PushCluster) -> None:
    """A 70 KB group name was echoed into the status details, and the client dropped the answer as
    RESOURCE_EXHAUSTED (metadata over 16 KiB): the typed error was lost."""
    name = "x" * 70_000
    with grpc.insecure_channel(healthy_after.coordinator.address) as ch:
        stub = coordinator_pb2_grpc.CoordinatorStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.DescribeGroup(coordinator_pb2.DescribeGroupRequest(group=name), timeout=10)
    exc: Any = info.value
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
    assert _code(exc) == common_pb2.INVALID_ARGUMENT
    assert exc.details().endswith("characters)")


@pytest.mark.parametrize(("broker_id", "epoch"), [(0, 2**63 - 1), (-2147483647, 263), (7, 2**40 + 1)])
def test_a_heartbeat_with_a_bogus_controller_epoch_is_refused_and_the_coordinator_keeps_leading(
    healthy_after: PushCluster, broker_id: int, epoch: int
) -> None:
    """One BrokerHeartbeat claiming controller epoch 2**63-1 made the coordinator raise its term to it and
    stand down, and no later term could be taken above it: NOT_COORDINATOR to every call, for good."""
    with grpc.insecure_channel(healthy_after.coordinator.address) as ch:
        stub = coordinator_pb2_grpc.CoordinatorStub(ch)
        bogus = coordinator_pb2.BrokerHeartbeatRequest(broker_id=broker_id, controller_epoch=epoch)
        with pytest.raises(grpc.RpcError) as info:
            stub.BrokerHeartbeat(bogus, timeout=10)
        exc: Any = info.value
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
        assert _code(exc) == common_pb2.INVALID_REQUEST
        listed = stub.ListTopics(coordinator_pb2.ListTopicsRequest(), timeout=10)
    assert "fuzz" in [t.name for t in listed.topics]


@pytest.mark.parametrize(
    "sent", [b"", b"\x00\x00", b"\x00\x00\x00\x09\x01abc"], ids=["nothing", "half-header", "half-hello"]
)
def test_a_wire_client_that_half_closes_before_its_hello_is_closed(
    healthy_after: PushCluster, sent: bytes
) -> None:
    """The dispatcher kept such a connection open for good (issue 16: half a frame, then FIN)."""
    conn = RawWire(wire_address(healthy_after.dispatcher.output))
    try:
        conn.sock.settimeout(5)
        conn.sock.sendall(sent)
        conn.sock.shutdown(socket.SHUT_WR)
        assert conn.sock.recv(100) == b""  # closed, with nothing said
    finally:
        conn.close()


def test_a_1mb_topic_name_gets_a_small_typed_error_naming_the_limit(healthy_after: PushCluster) -> None:
    """Was a 2 MB error echoing the whole name (issue 16); now the name is refused by its length first,
    with the limit named and the name cut to 200 characters plus its length."""
    name = "t" * 1_000_000
    with grpc.insecure_channel(healthy_after.coordinator.address) as ch:
        stub = coordinator_pb2_grpc.CoordinatorStub(ch)
        with pytest.raises(grpc.RpcError) as info:
            stub.CreateTopic(coordinator_pb2.CreateTopicRequest(name=name, partitions=1), timeout=10)
    exc: Any = info.value
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
    assert _code(exc) == common_pb2.INVALID_TOPIC
    details = exc.details()
    assert len(details.encode()) < 1024, len(details)
    assert "exceeds the limit of 249 characters" in details
    assert "(1000000 characters)" in details


def test_a_100kb_group_name_is_invalid_argument_naming_the_limit(healthy_after: PushCluster) -> None:
    """Was RESOURCE_EXHAUSTED: the echo passed the client's metadata limit and the typed error was lost."""
    with grpc.insecure_channel(healthy_after.coordinator.address) as ch:
        stub = coordinator_pb2_grpc.CoordinatorStub(ch)
        join = coordinator_pb2.GroupHeartbeatRequest(
            group="g" * 100_000, member_epoch=0, subscription={"fuzz": ""}
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.Heartbeat(join, timeout=10)
    exc: Any = info.value
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
    assert _code(exc) == common_pb2.INVALID_ARGUMENT
    assert "group name of 100000 characters exceeds the limit of 249" in exc.details()
    assert len(exc.details().encode()) < 1024


def test_a_1mb_topic_name_in_a_produce_gets_a_small_per_partition_error(healthy_after: PushCluster) -> None:
    """A per-partition error travels in the response body, where no trailer limit cuts it: it is cut at
    the source (``echo``) and bounded again when it becomes an ``Error`` message."""
    part = broker_pb2.ProducePartition(topic="p" * 1_000_000, partition=0, records=b"")
    with grpc.insecure_channel(healthy_after.broker.address) as ch:
        answer = broker_pb2_grpc.BrokerStub(ch).Produce(
            broker_pb2.ProduceRequest(acks=1, partitions=[part]), timeout=10
        )
    # The response still carries the topic as its key, as sent (the client matches answers by it); the
    # error itself is small.
    error = answer.partitions[0].error
    assert error.code != common_pb2.NONE
    assert len(error.message.encode()) < 1024, len(error.message)
    assert "(1000000 characters)" in error.message, error.message


def test_a_heartbeat_reporting_a_bogus_metadata_version_is_refused(healthy_after: PushCluster) -> None:
    """A BrokerHeartbeat claiming metadata version 2**63-1 made the coordinator jump its own version one
    past int64's range: every later broker update failed INTERNAL (found by internal_errors_total)."""
    with grpc.insecure_channel(healthy_after.coordinator.address) as ch:
        stub = coordinator_pb2_grpc.CoordinatorStub(ch)
        bogus = coordinator_pb2.BrokerHeartbeatRequest(broker_id=1, metadata_version=2**63 - 1)
        with pytest.raises(grpc.RpcError) as info:
            stub.BrokerHeartbeat(bogus, timeout=10)
        exc: Any = info.value
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc.details()
        assert _code(exc) == common_pb2.INVALID_REQUEST
        assert "was never issued" in exc.details()
