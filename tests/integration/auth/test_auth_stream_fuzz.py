"""Arbitrary Authenticate streams: any message sequence ends UNAUTHENTICATED, INVALID_ARGUMENT or THROTTLED,
never INTERNAL, and the coordinator keeps answering."""

from __future__ import annotations

import base64
import queue
from collections.abc import Iterable, Iterator

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.common.peers import Peers
from sluice.v1 import auth_pb2 as pb
from sluice.v1 import auth_pb2_grpc
from tests.integration.auth.conftest import Coordinator

ALLOWED = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

_text = st.text(max_size=40)
#: Client-first messages that look like SCRAM (so the exchange gets past parsing), and arbitrary bytes.
client_first = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda user, nonce: f"n,,n={user},r={nonce}".encode(), _text, _text),
    st.builds(lambda user: f"n,,n={user},r=abcdef".encode(), st.sampled_from(["alice", "zed", ""])),
)
client_final = st.one_of(
    st.binary(max_size=200),
    st.builds(
        lambda nonce, proof: f"c=biws,r={nonce},p={base64.b64encode(proof).decode()}".encode(),
        _text,
        st.binary(max_size=40),
    ),
)
mechanism = st.one_of(st.just("SCRAM-SHA-256"), _text)


@pytest.fixture(scope="module")
def stub(coordinator: Coordinator) -> Iterator[auth_pb2_grpc.AuthStub]:
    peers = Peers()
    try:
        yield peers.stub(coordinator.address, auth_pb2_grpc.AuthStub)
    finally:
        peers.close()


@settings(max_examples=150)
@given(
    mechanism,
    client_first,
    st.lists(client_final, max_size=3),
)
def test_arbitrary_messages_never_reach_internal(
    stub: auth_pb2_grpc.AuthStub, mech: str, first: bytes, rest: list[bytes]
) -> None:
    messages = [pb.AuthMessage(mechanism=mech, scram=first), *(pb.AuthMessage(scram=m) for m in rest)]
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Authenticate(iter(messages), timeout=10))
    err: grpc.Call = info.value  # type: ignore[assignment]
    assert err.code() in ALLOWED, (err.code(), err.details())


@settings(max_examples=100)
@given(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=12), st.binary(max_size=64)
)
def test_a_well_formed_exchange_with_a_forged_proof_is_unauthenticated(
    stub: auth_pb2_grpc.AuthStub, user: str, proof: bytes
) -> None:
    """Past the parsing: the final message carries the server's nonce, so the proof itself is checked."""
    server_first: queue.Queue[str] = queue.Queue()

    def requests() -> Iterator[pb.AuthMessage]:
        yield pb.AuthMessage(mechanism="SCRAM-SHA-256", scram=f"n,,n=fz-{user},r=clientnonce".encode())
        nonce = dict(p.split("=", 1) for p in server_first.get(timeout=10).split(","))["r"]
        yield pb.AuthMessage(scram=f"c=biws,r={nonce},p={base64.b64encode(proof).decode()}".encode())

    def drain(responses: Iterable[pb.AuthMessage]) -> None:
        for response in responses:
            server_first.put(response.scram.decode())

    with pytest.raises(grpc.RpcError) as info:
        drain(stub.Authenticate(requests(), timeout=10))
    err: grpc.Call = info.value  # type: ignore[assignment]
    assert err.code() in ALLOWED, (err.code(), err.details())
    if len(proof) == 32:  # a proof of the right length: only the check itself can refuse it
        assert err.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED)


def test_an_empty_stream_is_an_invalid_argument(stub: auth_pb2_grpc.AuthStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        list(stub.Authenticate(iter([]), timeout=10))
    err: grpc.Call = info.value  # type: ignore[assignment]
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_coordinator_still_answers_after_the_fuzz(
    stub: auth_pb2_grpc.AuthStub, coordinator: Coordinator
) -> None:
    stub.ListUsers(pb.ListUsersRequest(), timeout=10)
    assert coordinator.process.process.poll() is None
    assert "Traceback" not in coordinator.process.log()
