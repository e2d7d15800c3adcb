"""The connections that carry a client's produce and fetch requests to its brokers.

:class:`BrokerLinks` belongs to a ``Client`` (or to a producer or consumer made without one)
and hands out links: over the wire protocol (``client.shared_wire``) when the broker
advertises a wire port, else the Broker gRPC streams (``client.streams``). Both answer
requests in order and fail what is waiting with a typed, retriable error when they end, so
callers do not care which they hold. ``docs/wire.md`` says why there are two.

Over the wire, every producer and fetcher of the client shares **one connection per broker**
(version 2, lanes), as Kafka clients do: 1,000 consumers of one client cost a broker one
connection. Over gRPC each link is a stream on the client's one channel per broker.

``SLUICE_CLIENT_TRANSPORT=grpc`` in the environment makes the SDK use the gRPC streams even
where a wire port is advertised: for a network that passes only gRPC (a gRPC-aware proxy),
and to compare the two.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Protocol

import grpc

from sluice.client.metadata import MetadataCache
from sluice.client.shared_wire import SharedConnection
from sluice.client.streams import Callback, RequestStream
from sluice.client.wire_lanes import FetchLane
from sluice.common.peers import Peers
from sluice.errors import BrokerNotAvailable, InvalidArgument, SluiceError
from sluice.v1 import broker_pb2_grpc

__all__ = ["TRANSPORT_ENV", "BrokerLink", "BrokerLinks", "FetchLane", "use_wire"]

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


class BrokerLinks:
    """A client's links to its brokers: one shared wire connection per broker, opened lazily.

    Thread-safe. ``close()`` ends every shared connection (what waits fails, retriable) and
    makes later ``produce``/``fetch`` calls raise BrokerNotAvailable.
    """

    def __init__(self, channels: Peers, metadata: MetadataCache, client_id: str = "") -> None:
        self._channels = channels
        self._metadata = metadata
        self._client_id = client_id
        self._lock = threading.Lock()
        self._wire: dict[str, SharedConnection] = {}
        self._closed = False

    def produce(self, address: str) -> BrokerLink:
        """A producer's link to ``address``. Raises BrokerNotAvailable when none can be made."""
        wire = self._shared(address)
        if wire is not None:
            return wire.produce_link()
        return RequestStream(self._announced(self._stub(address).ProduceStream), f"produce-{address}")

    def fetch(self, address: str) -> BrokerLink:
        """A fetcher's link to ``address`` (a ``FetchLane`` over the wire, which can follow)."""
        wire = self._shared(address)
        if wire is not None:
            return wire.fetch_lane()
        return RequestStream(self._announced(self._stub(address).FetchStream), f"fetch-{address}")

    def connections(self) -> int:
        """Wire connections made so far (open or reopening), one per broker at most."""
        with self._lock:
            return len(self._wire)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._wire = list(self._wire.values()), {}
        for conn in conns:
            conn.close()

    def _announced(self, method: Any) -> Any:
        """``method`` called with this client's id in the metadata (``sluice-client-id``): whom the
        broker's quotas count an anonymous client as, as the wire hello's ``client_id`` does."""
        if not self._client_id:
            return method
        metadata = (("sluice-client-id", self._client_id),)
        return lambda requests: method(requests, metadata=metadata)

    def _shared(self, address: str) -> SharedConnection | None:
        if not use_wire() or self._metadata.current().wire_address(address) is None:
            return None
        with self._lock:
            if self._closed:
                raise BrokerNotAvailable(f"cannot reach broker {address}: the client is closed")
            conn = self._wire.get(address)
            if conn is None:
                metadata = self._metadata
                # Resolved again at every (re)connect: the metadata a failure refreshes has the current port.
                conn = self._wire[address] = SharedConnection(
                    lambda: metadata.current().wire_address(address),
                    f"wire-{address}",
                    client_id=self._client_id,
                    security=self._channels.security,
                )
            return conn

    def _stub(self, address: str) -> broker_pb2_grpc.BrokerStub:
        try:
            return self._channels.stub(address, broker_pb2_grpc.BrokerStub)
        except (SluiceError, grpc.RpcError, ValueError) as exc:  # e.g. the client was closed
            raise BrokerNotAvailable(f"cannot reach broker {address}: {exc}") from exc
