"""Test peers for the coordinator integration tests.

``PeerBroker`` plays a broker: it registers and heartbeats through the real Coordinator API and runs a tiny
real gRPC server implementing ``Broker.UpdatePartitions`` (following the broker contract of
docs/coordinator.md), so tests can observe what the coordinator pushes. It is a test peer, not a mock of a
Sluice service: the coordinator under test is the real process.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import grpc
from tests.broker_peer import CoordinatorFacingBroker
from tests.harness import restart, start_service

from sluice.client.rpc import error_from_rpc
from sluice.errors import SluiceError
from sluice.v1 import broker_pb2, broker_pb2_grpc, coordinator_pb2, coordinator_pb2_grpc

T = TypeVar("T")
ResponseT = TypeVar("ResponseT")


class PeerBroker(CoordinatorFacingBroker):
    def __init__(self, broker_id: int, delay_s: float = 0.0) -> None:
        self.broker_id = broker_id
        self.delay_s = delay_s
        self.incarnation = uuid.uuid4().hex
        self.epoch = 0
        self.version = 0
        self.partitions: dict[tuple[str, int], str] = {}
        self.received: list[broker_pb2.UpdatePartitionsRequest] = []
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._server = grpc.server(ThreadPoolExecutor(max_workers=4))
        broker_pb2_grpc.add_BrokerServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def stop(self) -> None:
        self._server.stop(None).wait()

    # ---- the broker side of UpdatePartitions ---------------------------------------------------------

    def apply(self, update: broker_pb2.UpdatePartitionsRequest) -> None:
        with self._lock:
            self.received.append(update)
            if update.full:
                if update.metadata_version >= self.version:
                    self.partitions = {(a.topic, a.partition): a.topic_id for a in update.assign}
                    self.version = update.metadata_version
            elif self.version > 0 and update.metadata_version > self.version:
                for a in update.remove:
                    if self.partitions.get((a.topic, a.partition)) == a.topic_id:
                        del self.partitions[(a.topic, a.partition)]
                for a in update.assign:
                    self.partitions[(a.topic, a.partition)] = a.topic_id
                self.version = update.metadata_version
            self._changed.notify_all()

    def UpdatePartitions(
        self, request: broker_pb2.UpdatePartitionsRequest, context: grpc.ServicerContext
    ) -> broker_pb2.UpdatePartitionsResponse:
        if self.delay_s:
            time.sleep(self.delay_s)
        self.apply(request)
        return broker_pb2.UpdatePartitionsResponse()

    def wait_for_version(self, version: int, timeout: float = 5.0) -> bool:
        with self._lock:
            return self._changed.wait_for(lambda: self.version >= version, timeout)

    # ---- the broker side of the Coordinator API ------------------------------------------------------

    def register(self, stub: coordinator_pb2_grpc.CoordinatorStub) -> coordinator_pb2.RegisterBrokerResponse:
        response = call(
            stub.RegisterBroker,
            coordinator_pb2.RegisterBrokerRequest(
                broker_id=self.broker_id,
                endpoint=coordinator_pb2.Endpoint(host="127.0.0.1", port=self.port),
                incarnation=self.incarnation,
            ),
        )
        self.epoch = response.broker_epoch
        return response

    def heartbeat(
        self, stub: coordinator_pb2_grpc.CoordinatorStub
    ) -> coordinator_pb2.BrokerHeartbeatResponse:
        response = call(
            stub.BrokerHeartbeat,
            coordinator_pb2.BrokerHeartbeatRequest(
                broker_id=self.broker_id, broker_epoch=self.epoch, metadata_version=self.version
            ),
        )
        if response.HasField("update"):
            self.apply(response.update)
        return response


@contextlib.contextmanager
def peer_broker(broker_id: int, delay_s: float = 0.0) -> Iterator[PeerBroker]:
    peer = PeerBroker(broker_id, delay_s)
    try:
        yield peer
    finally:
        peer.stop()


class Coordinator:
    """A ``sluice coordinator`` process (tests/harness.py) that can be stopped, killed and started again."""

    def __init__(self, *args: str) -> None:
        self.args = args
        self.sp = start_service("coordinator", *args)

    @property
    def address(self) -> str:
        return self.sp.address

    @property
    def port(self) -> int:
        return self.sp.port

    @property
    def metrics(self) -> str:
        return self.sp.metrics

    def stop(self, kill: bool = False) -> int | None:
        """SIGTERM (returns the exit code), or SIGKILL as a crash would (returns None)."""
        if kill:
            self.sp.kill()
            return None
        return self.sp.terminate()

    def restart(self) -> None:
        """Start again with the same arguments (after ``stop``)."""
        self.sp = restart(self.sp)

    def log(self) -> str:
        return self.sp.log()


@contextlib.contextmanager
def run_coordinator(*args: str) -> Iterator[Coordinator]:
    c = Coordinator(*args)
    try:
        yield c
    finally:
        c.stop()


@contextlib.contextmanager
def coordinator_stub(address: str) -> Iterator[coordinator_pb2_grpc.CoordinatorStub]:
    with grpc.insecure_channel(address) as channel:
        yield coordinator_pb2_grpc.CoordinatorStub(channel)


def call(method: Callable[..., ResponseT], request: Any, timeout: float = 10.0) -> ResponseT:
    return method(request, timeout=timeout)


def typed_error(method: Any, request: Any) -> tuple[SluiceError, str | None]:
    """Call expecting failure: the typed error rebuilt by the SDK, and the raw ``sluice-error-code``."""
    try:
        method(request, timeout=10.0)
    except grpc.RpcError as exc:
        # grpc-stubs types RpcError's trailers as `_Metadatum` objects; at run time they are the
        # (key, value) pairs of every other gRPC call (sluice.common.rpc reads them the same way).
        trailers = cast("tuple[tuple[str, str | bytes], ...]", exc.trailing_metadata() or ())
        trailer = dict(trailers).get("sluice-error-code")
        assert trailer is None or isinstance(trailer, str)
        return error_from_rpc(exc), trailer
    raise AssertionError("the call succeeded but an error was expected")
