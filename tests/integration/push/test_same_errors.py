"""One dispatcher core under both transports (docs/architecture.md, "The dispatcher"): the same bad
Consume commands get the same typed errors, in the same order, with the same end of stream, over a
gRPC ``Consume`` stream and over a wire-protocol connection."""

from __future__ import annotations

import socket
from collections.abc import Sequence

import grpc
import pytest

from sluice.common.wire import FrameType
from sluice.v1 import common_pb2, dispatcher_pb2_grpc
from sluice.v1 import dispatcher_pb2 as dpb
from tests.integration.push.conftest import PushCluster
from tests.wire_client import RawWire, wire_address

Outcome = list[tuple[str, int, str]]  # (event kind, error code, error message)


def _outcome(events: Sequence[dpb.DispatcherEvent]) -> Outcome:
    out: Outcome = []
    for ev in events:
        kind = ev.WhichOneof("event") or ""
        out.append((kind, ev.error.code, ev.error.message) if kind == "error" else (kind, 0, ""))
    return out


def _over_grpc(cluster: PushCluster, commands: list[dpb.ConsumerCommand]) -> Outcome:
    """Send every command, half-close, and read the events until the dispatcher ends the stream."""
    with grpc.insecure_channel(cluster.dispatcher.address) as channel:
        stub = dispatcher_pb2_grpc.DispatcherStub(channel)
        return _outcome(list(stub.Consume(iter(commands), timeout=20)))


def _over_wire(cluster: PushCluster, commands: list[dpb.ConsumerCommand]) -> Outcome:
    conn = RawWire(wire_address(cluster.dispatcher.output))
    try:
        conn.hello()
        for command in commands:
            conn.send(FrameType.CONSUME, command.SerializeToString())
        conn.sock.shutdown(socket.SHUT_WR)  # the consumer is done: the dispatcher ends the stream
        events = []
        for _ in range(100):
            got = conn.recv()
            if got is None:
                break
            assert got[0] == FrameType.CONSUME, got
            events.append(dpb.DispatcherEvent.FromString(got[1]))
        return _outcome(events)
    finally:
        conn.close()


def _subscribe(topic: str, **kw: object) -> dpb.ConsumerCommand:
    sub = dpb.Subscribe(topic=topic, subscription="same-errors", consumer_id="c-1", **kw)  # type: ignore[arg-type]
    return dpb.ConsumerCommand(subscribe=sub)


def _cases(topic: str) -> dict[str, tuple[list[dpb.ConsumerCommand], list[int]]]:
    shared = _subscribe(topic, type=dpb.SUBSCRIPTION_TYPE_SHARED)
    return {
        "bad-topic-name": ([_subscribe("no spaces allowed")], [common_pb2.INVALID_TOPIC]),
        "negative-limit": ([_subscribe(topic, max_unacked=-1)], [common_pb2.INVALID_ARGUMENT]),
        "bad-filter": ([_subscribe(topic, filter="a ||")], [common_pb2.INVALID_FILTER]),
        "unknown-partition": ([_subscribe(topic, partitions=[7])], [common_pb2.UNKNOWN_TOPIC_OR_PARTITION]),
        "flow-first": ([dpb.ConsumerCommand(flow=dpb.Flow(permits=1))], [common_pb2.PROTOCOL_VIOLATION]),
        "bad-commands-on-a-stream": (
            [
                shared,
                dpb.ConsumerCommand(flow=dpb.Flow(permits=0)),
                dpb.ConsumerCommand(ack=dpb.Ack(ranges=[dpb.OffsetRanges(partition=0, bounds=[1, 2, 3])])),
                dpb.ConsumerCommand(ack=dpb.Ack(ranges=[dpb.OffsetRanges(partition=0, bounds=[0, 10**9])])),
                dpb.ConsumerCommand(ack=dpb.Ack(ids=[dpb.MessageId(partition=0, offset=0)], cumulative=True)),
                dpb.ConsumerCommand(ack=dpb.Ack(ids=[dpb.MessageId(partition=0, offset=5)])),
                dpb.ConsumerCommand(nack=dpb.Nack(ids=[dpb.MessageId(partition=3, offset=1)])),
                shared,
                dpb.ConsumerCommand(),
            ],
            [
                common_pb2.INVALID_PERMITS,
                common_pb2.INVALID_ARGUMENT,
                common_pb2.INVALID_ARGUMENT,
                common_pb2.INVALID_REQUEST,
                common_pb2.UNKNOWN_MESSAGE_ID,
                common_pb2.UNKNOWN_MESSAGE_ID,
                common_pb2.PROTOCOL_VIOLATION,
                common_pb2.PROTOCOL_VIOLATION,
            ],
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "bad-topic-name",
        "negative-limit",
        "bad-filter",
        "unknown-partition",
        "flow-first",
        "bad-commands-on-a-stream",
    ],
)
def test_the_same_bad_commands_get_the_same_errors_on_both_transports(
    cluster: PushCluster, topic: str, case: str
) -> None:
    commands, codes = _cases(topic)[case]
    grpc_outcome = _over_grpc(cluster, commands)
    wire_outcome = _over_wire(cluster, commands)
    assert [code for kind, code, _ in grpc_outcome if kind == "error"] == codes, grpc_outcome
    assert wire_outcome == grpc_outcome
