"""A follower's connection to its leader's wire port: one long-poll FETCH frame at a time, on asyncio.

The wire protocol (``docs/wire.md``) carries the same ``FetchRequest`` as gRPC. A follower sends one
request per answer (each carries its log end and flushed offset, which the leader's high watermark needs;
docs/replication.md, "The data path"), so the cost per message is what matters: under grpcio a message
costs several thread hand-offs on each side, a wire frame none (the broker's event loop reads it; this
side's event loop writes it). The SDK's wire connection is thread-based; a broker's fetcher lives on its
event loop, so this is the small asyncio client it needs: the hello, then fetch frames and their answers,
strictly one at a time (nothing to route by lane).

A cancelled fetch (the fetcher re-planned) leaves the stream mid-answer: the connection is closed and
the next fetch opens another.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl

from sluice.common.client_security import process_security
from sluice.common.client_tls import client_ssl_context, server_hostname
from sluice.common.timeouts import within
from sluice.common.wire import (
    CONNECT_TIMEOUT_S,
    HEADER,
    PROTOCOL_VERSION,
    FrameType,
    WireProtocolError,
    error_from_frame,
    frame,
)
from sluice.errors import AuthenticationError, BrokerNotAvailable, raise_for_proto
from sluice.v1 import broker_pb2, wire_pb2

__all__ = ["ReplicaWire"]


class ReplicaWire:
    """One greeted connection to a leader's wire port. Event-loop thread only."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str) -> None:
        self._reader = reader
        self._writer = writer
        self._name = name

    @classmethod
    async def open(cls, host: str, port: int, broker_id: int) -> ReplicaWire:
        name = f"leader wire {host}:{port}"
        # The broker's own TLS and cluster token (set at its start), asked per connection.
        security = process_security()
        tls = security.tls
        try:
            if tls is None:
                opening = asyncio.open_connection(host, port)
            else:
                opening = asyncio.open_connection(
                    host, port, ssl=client_ssl_context(tls), server_hostname=server_hostname(tls, host)
                )
            reader, writer = await within(opening, CONNECT_TIMEOUT_S)
        except ssl.SSLError as exc:
            raise AuthenticationError(f"{name}: TLS handshake failed: {exc.reason or exc}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = cls(reader, writer, name)
        try:
            hello = wire_pb2.WireHello(
                version=PROTOCOL_VERSION,
                client_id=f"broker-{broker_id}-replica",
                metadata=dict(security.metadata()),
            )
            writer.write(frame(FrameType.HELLO, hello.SerializeToString()))
            kind, payload = await within(conn._read(), CONNECT_TIMEOUT_S)
            if kind != FrameType.HELLO:
                raise WireProtocolError(f"{name}: expected a hello answer, got frame type {kind}")
            raise_for_proto(wire_pb2.WireHelloResponse.FromString(payload).error)
        except BaseException:
            conn.close()
            raise
        return conn

    async def fetch(self, request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
        self.send(request)
        return await self.answer()

    def send(self, request: broker_pb2.FetchRequest) -> None:
        """Write the fetch frame now (the caller then awaits :meth:`answer`)."""
        self._writer.write(frame(FrameType.FETCH, request.SerializeToString()))

    async def answer(self) -> broker_pb2.FetchResponse:
        """The answer to the fetch :meth:`send` wrote."""
        try:
            kind, payload = await self._read()
        except asyncio.CancelledError:
            self.close()  # the answer would arrive mid-stream of the next request
            raise
        if kind != FrameType.FETCH:
            raise WireProtocolError(f"{self._name}: expected a fetch answer, got frame type {kind}")
        return broker_pb2.FetchResponse.FromString(payload)

    @property
    def closed(self) -> bool:
        return self._writer.is_closing()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()

    async def _read(self) -> tuple[int, bytes]:
        try:
            length, kind = HEADER.unpack(await self._reader.readexactly(HEADER.size))
            payload = await self._reader.readexactly(length - 1)
        except asyncio.IncompleteReadError:
            self.close()
            raise BrokerNotAvailable(f"{self._name}: the connection closed") from None
        if kind == FrameType.ERROR:
            self.close()
            raise error_from_frame(payload, self._name)
        return kind, payload
