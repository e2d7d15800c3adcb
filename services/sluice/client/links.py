"""The connection that carries a producer's or a fetcher's requests to one broker.

The wire protocol (``client.wire``) when the broker advertises a wire port, else the Broker
gRPC streams (``client.streams``); both answer requests in order and fail what is waiting
with a typed, retriable error when they end, so callers do not care which they hold.
``docs/wire.md`` says why there are two.

``SLUICE_CLIENT_TRANSPORT=grpc`` in the environment makes the SDK use the gRPC streams even
where a wire port is advertised: for a network that passes only gRPC (a gRPC-aware proxy),
and to compare the two.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import grpc

from sluice.client.metadata import MetadataCache
from sluice.client.streams import Callback, RequestStream
from sluice.client.wire import WireConnection
from sluice.common.peers import Peers
from sluice.common.wire import FrameType
from sluice.errors import BrokerNotAvailable, InvalidArgument, SluiceError
from sluice.v1 import broker_pb2, broker_pb2_grpc

__all__ = ["TRANSPORT_ENV", "BrokerLink", "open_fetch_link", "open_produce_link", "use_wire"]

TRANSPORT_ENV = "SLUICE_CLIENT_TRANSPORT"


class BrokerLink(Protocol):
    def send(self, request: Any, timeout: float, on_done: Callback) -> None: ...

    def close(self) -> None: ...


def use_wire() -> bool:
    """False when the environment says to use gRPC even where a wire port is advertised."""
    transport = os.environ.get(TRANSPORT_ENV, "auto").strip().lower()
    if transport not in ("auto", "grpc"):
        raise InvalidArgument(f"{TRANSPORT_ENV} must be auto or grpc, got {transport!r}")
    return transport == "auto"


def _open(
    channels: Peers, metadata: MetadataCache, address: str, kind: FrameType, client_id: str
) -> BrokerLink:
    name = f"{kind.name.lower()}-{address}"
    if use_wire() and metadata.current().wire_address(address) is not None:
        response_type = broker_pb2.ProduceResponse if kind is FrameType.PRODUCE else broker_pb2.FetchResponse
        # Resolved again at every (re)connect: the metadata a failure refreshes has the current port.
        resolve = lambda: metadata.current().wire_address(address)  # noqa: E731
        return WireConnection(resolve, kind, response_type, name, client_id=client_id)
    try:
        stub = channels.stub(address, broker_pb2_grpc.BrokerStub)
    except (SluiceError, grpc.RpcError, ValueError) as exc:  # e.g. the client was closed
        raise BrokerNotAvailable(f"cannot reach broker {address}: {exc}") from exc
    if kind is FrameType.PRODUCE:
        return RequestStream(stub.ProduceStream, name)
    return RequestStream(stub.FetchStream, name)


def open_produce_link(
    channels: Peers, metadata: MetadataCache, address: str, client_id: str = ""
) -> BrokerLink:
    """Raises BrokerNotAvailable when no link can be made (the client is closed)."""
    return _open(channels, metadata, address, FrameType.PRODUCE, client_id)


def open_fetch_link(
    channels: Peers, metadata: MetadataCache, address: str, client_id: str = ""
) -> BrokerLink:
    """Raises BrokerNotAvailable when no link can be made (the client is closed)."""
    return _open(channels, metadata, address, FrameType.FETCH, client_id)
