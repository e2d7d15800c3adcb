"""Every RPC of every service, fuzzed against a real cluster: no input gets INTERNAL or UNKNOWN, a
status without a registered ``sluice-error-code``, or a traceback in a service's log, and every process
still answers its health check SERVING afterwards.

Requests are arbitrary well-typed messages built from the descriptors (messages.py), raw bytes sent as
the serialized request, and for streaming RPCs short sequences of both. bench/fuzz/rpcs.py runs the same
calls with many more examples.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings

from sluice.v1 import coordinator_pb2, coordinator_pb2_grpc
from tests.integration.push.conftest import PushCluster

from .rpcs import LAST, MODULES, ORDERED, RPCS, SERVED_BY, call, request_strategy

EXAMPLES = 50
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],  # no explain: minutes per failure
)


def test_every_rpc_is_fuzzed() -> None:
    """RPCS comes from the descriptors; every service there is one we know the process of, and every
    RPC gets a strategy (a message type the generic strategy can build)."""
    services = {s.full_name for m in MODULES for s in m.DESCRIPTOR.services_by_name.values()}
    assert services == set(SERVED_BY)
    assert len(RPCS) >= 52
    for rpc in RPCS.values():
        assert rpc.process, f"{rpc.path}: no process serves it, or a call shape the suite cannot send"
        request_strategy(rpc).validate()
    assert set(RPCS) >= LAST


@pytest.mark.filterwarnings("ignore:Generating overly large repr")
@pytest.mark.parametrize("path", ORDERED)
def test_no_input_gets_an_untyped_answer(healthy_after: PushCluster, path: str) -> None:
    rpc = RPCS[path]
    address = {
        "coordinator": healthy_after.coordinator,
        "broker": healthy_after.broker,
        "offset-store": healthy_after.offset_store,
        "dispatcher": healthy_after.dispatcher,
    }[rpc.process].address
    with grpc.insecure_channel(address) as channel:

        @SETTINGS
        @given(request=request_strategy(rpc))
        def fuzz(request: Any) -> None:
            event(call(channel, rpc, request))

        fuzz()


def test_after_fuzzing_the_coordinator_still_leads(healthy_after: PushCluster) -> None:
    """Last: what the fuzzed RPCs did (the LAST ones included) left a coordinator that answers, not one
    stood down for good (the bogus controller epoch of test_regressions.py)."""
    deadline = time.monotonic() + 15
    with grpc.insecure_channel(healthy_after.coordinator.address) as ch:
        stub = coordinator_pb2_grpc.CoordinatorStub(ch)
        last: grpc.RpcError | None = None
        while time.monotonic() < deadline:
            try:
                stub.ListTopics(coordinator_pb2.ListTopicsRequest(), timeout=5)
                return
            except grpc.RpcError as exc:
                last = exc
                time.sleep(0.2)
    raise AssertionError(f"the coordinator stopped leading: {last}")
