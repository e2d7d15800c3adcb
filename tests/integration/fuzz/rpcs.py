"""Every RPC Sluice serves, enumerated from the proto descriptors, and one fuzzed call of each.

``RPCS`` is built from the service descriptors, not listed by hand; ``SERVED_BY`` says which process
serves each service and ``LAST`` which RPCs may legitimately break the calls after them. A new service
without an entry here fails ``test_every_rpc_is_fuzzed``. ``call`` sends one request (a message, raw
bytes, or for a streaming RPC a short sequence of either) and classifies the answer: ``"OK"``, the name
of a typed Sluice error, or a ``Failure`` (INTERNAL, UNKNOWN, a status without a registered
``sluice-error-code``, or no answer in time).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, MethodDescriptor
from hypothesis import strategies as st

from sluice.common.rpc import ERROR_CODE_KEY
from sluice.errors import registry
from sluice.v1 import (
    acl_pb2,
    auth_pb2,
    broker_pb2,
    common_pb2,
    coordinator_pb2,
    dispatcher_pb2,
    offset_store_pb2,
    quota_pb2,
)
from tests.integration.fuzz.messages import message_strategy, raw_request

MODULES = (broker_pb2, coordinator_pb2, offset_store_pb2, dispatcher_pb2, acl_pb2, auth_pb2, quota_pb2)

#: The process that serves each gRPC service (Acls and Auth ride on the coordinator).
SERVED_BY = {
    "sluice.v1.Broker": "broker",
    "sluice.v1.Coordinator": "coordinator",
    "sluice.v1.OffsetStore": "offset-store",
    "sluice.v1.Dispatcher": "dispatcher",
    "sluice.v1.Acls": "coordinator",
    "sluice.v1.Auth": "coordinator",
    "sluice.v1.Quotas": "coordinator",
}
#: RPCs whose fuzzed calls may break the cluster for the calls after them (a broker told to drop its
#: partitions, or to shut down; a topic of the fixture deleted). They run after every other one.
LAST = frozenset(
    {
        "/sluice.v1.Broker/UpdatePartitions",
        "/sluice.v1.Coordinator/ControlledShutdown",
        "/sluice.v1.Coordinator/DeleteTopic",
        "/sluice.v1.Coordinator/RegisterBroker",
        "/sluice.v1.Coordinator/BrokerHeartbeat",
        "/sluice.v1.Coordinator/RegisterDispatcher",
        "/sluice.v1.Coordinator/AlterPartition",
        "/sluice.v1.Coordinator/ReassignPartitions",
        "/sluice.v1.Quotas/AlterQuotas",  # a quota set could throttle the calls after it
    }
)
#: A unary call's answer must come within this; a stream is read this long, then cancelled.
UNARY_TIMEOUT = 10.0
STREAM_WINDOW = 1.5
#: Long polls: a call may wait by design (WatchSecurity up to a minute), so it is given this long and a
#: deadline passing is an outcome ("WAITING"), not a failure.
LONG_POLLS = {"/sluice.v1.Acls/WatchSecurity": 1.0, "/sluice.v1.Quotas/WatchQuotas": 1.0}
#: Statuses that never carry a typed error: a handler that raised something unexpected.
UNTYPED = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


@dataclass(frozen=True)
class Rpc:
    path: str
    process: str
    request: Descriptor
    streaming: bool


def _rpcs() -> dict[str, Rpc]:
    out: dict[str, Rpc] = {}
    for module in MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            method: MethodDescriptor
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                # Unary or bidirectional only: a new shape gets no process ("") and fails the test.
                same_shape = method.client_streaming == method.server_streaming
                process = SERVED_BY.get(service.full_name, "") if same_shape else ""
                out[path] = Rpc(path, process, method.input_type, method.client_streaming)
    return out


RPCS = _rpcs()
#: The order the suite fuzzes them in: LAST after every other.
ORDERED: list[str] = sorted(RPCS, key=lambda path: (path in LAST, path))


class Failure(AssertionError):
    """An answer no input may produce."""


def _typed(exc: grpc.RpcError) -> str:
    call: Any = exc
    status = call.code()
    if status in UNTYPED:
        raise Failure(f"{status.name}: {call.details()}")
    codes = [v for k, v in call.trailing_metadata() or () if k == ERROR_CODE_KEY]
    if not codes:
        raise Failure(f"{status.name} without {ERROR_CODE_KEY}: {call.details()}")
    code = int(codes[0])
    if code == common_pb2.UNKNOWN or code not in registry():
        raise Failure(f"{status.name} with unregistered code {code}: {call.details()}")
    return registry()[code].__name__


def _payload(request: Any) -> bytes:
    return request if isinstance(request, bytes) else request.SerializeToString()


def call_unary(channel: grpc.Channel, rpc: Rpc, request: Any) -> str:
    method = channel.unary_unary(rpc.path, None, None)  # no serializers: bytes in, bytes out
    timeout = LONG_POLLS.get(rpc.path, UNARY_TIMEOUT)
    try:
        method(_payload(request), timeout=timeout)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            if rpc.path in LONG_POLLS:
                return "WAITING"
            raise Failure(f"no answer within {timeout}s") from None
        return _typed(exc)
    return "OK"


def call_stream(channel: grpc.Channel, rpc: Rpc, requests: Sequence[Any]) -> str:
    """Send the requests, read answers for ``STREAM_WINDOW`` seconds, then cancel (a stream the server
    keeps open, as a live consumer's, is fine). A status the server ended the stream with must be
    typed or OK."""
    method = channel.stream_stream(rpc.path, None, None)
    sent = threading.Event()

    def requests_then_hold() -> Iterator[bytes]:
        for r in requests:
            yield _payload(r)
        sent.set()

    call: Any = method(requests_then_hold(), timeout=STREAM_WINDOW + UNARY_TIMEOUT)
    ended: queue.SimpleQueue[str | BaseException] = queue.SimpleQueue()

    def read() -> None:
        try:
            for _ in call:
                pass
            ended.put("OK")
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED:
                ended.put("CANCELLED")  # by us, below
                return
            try:
                ended.put(_typed(exc))
            except Failure as failure:
                ended.put(failure)

    reader = threading.Thread(target=read, daemon=True, name="fuzz-stream-reader")
    reader.start()
    try:
        outcome = ended.get(timeout=STREAM_WINDOW)
    except queue.Empty:
        call.cancel()
        outcome = "OPEN"  # the server kept the stream open: a live stream, not a failure
        reader.join(UNARY_TIMEOUT)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def call(channel: grpc.Channel, rpc: Rpc, request: Any) -> str:
    """One fuzzed call; ``request`` is a message or bytes (unary) or a list of them (streaming)."""
    if rpc.streaming:
        return call_stream(channel, rpc, request)
    return call_unary(channel, rpc, request)


def request_strategy(rpc: Rpc) -> st.SearchStrategy[Any]:
    """A request for ``rpc``: mostly well-typed messages, sometimes raw bytes; a short list for a stream."""
    one = st.one_of(message_strategy(rpc.request), message_strategy(rpc.request), raw_request(rpc.request))
    if rpc.streaming:
        return st.lists(one, min_size=1, max_size=4)
    return one
