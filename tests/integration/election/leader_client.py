"""The SDK's leader-following rule (docs/election.md), in test form: call the leader; on NOT_COORDINATOR
or a transport failure, find the leader through ``Metadata`` on any known replica and retry there; on
another retriable error, retry at the same leader after a back-off."""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc

from sluice.errors import NotCoordinator, SluiceError, error_for_code
from sluice.server.interceptors import ERROR_CODE_KEY
from sluice.v1 import coordinator_pb2 as pb
from sluice.v1 import coordinator_pb2_grpc


class Retriable(Exception):
    """A transport failure (no sluice error code): the replica is gone or unreachable."""


def typed(exc: grpc.RpcError) -> SluiceError | Retriable:
    call: Any = exc
    for key, value in call.trailing_metadata() or ():
        if key == ERROR_CODE_KEY:
            return error_for_code(int(value), call.details() or "")
    return Retriable(f"{call.code().name}: {call.details()}")


class LeaderFollower:
    def __init__(self, bootstrap: list[str], give_up_after_s: float = 15.0) -> None:
        self.bootstrap = list(bootstrap)
        self.give_up_after_s = give_up_after_s
        self.leader: str | None = None
        self.redirects = 0
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}

    def stub(self, address: str) -> coordinator_pb2_grpc.CoordinatorStub:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = grpc.insecure_channel(address)
            return coordinator_pb2_grpc.CoordinatorStub(channel)

    def discover(self) -> str | None:
        """Rule 2: ask ``Metadata`` of every known replica; the first ``coordinator`` answer wins."""
        for address in self.bootstrap:
            try:
                response = self.stub(address).Metadata(pb.MetadataRequest(topics=["-"]), timeout=2.0)
            except grpc.RpcError:
                continue
            if response.HasField("coordinator"):
                return f"{response.coordinator.host}:{response.coordinator.port}"
        return None

    def call(self, method: str, request: Any, timeout: float = 3.0) -> Any:
        deadline = time.monotonic() + self.give_up_after_s
        backoff = 0.05
        while True:
            address = self.leader or self.discover()
            error: BaseException
            if address is None:
                error = NotCoordinator("no leader known yet")
            else:
                try:
                    return getattr(self.stub(address), method)(request, timeout=timeout)
                except grpc.RpcError as exc:
                    error = typed(exc)
                    if isinstance(error, SluiceError) and not isinstance(error, NotCoordinator):
                        if not error.retriable:
                            raise error from None  # the leader's own answer
                        # Retriable at the leader (e.g. BROKER_NOT_AVAILABLE until brokers heartbeat the
                        # new leader): same leader, after a back-off.
                        if time.monotonic() > deadline:
                            raise error from None
                        time.sleep(backoff)
                        backoff = min(backoff * 2, 0.4)
                        continue
                self.leader = None
                self.redirects += 1
            if time.monotonic() > deadline:
                raise error
            time.sleep(backoff)  # back off between rounds while the election settles
            backoff = min(backoff * 2, 0.4)
            if self.leader is None:
                self.leader = self.discover()

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
