"""A follower's connection to its leader's wire port: one long-poll FETCH frame at a time, on asyncio.

The wire protocol (``docs/wire.md``) carries the same ``FetchRequest`` as gRPC. A follower sends one
request per answer (each carries its log end and flushed offset, which the leader's high watermark needs;
docs/replication.md, "The data path"), so the cost per message is what matters: under grpcio a message
costs several thread hand-offs on each side, a wire frame none (the broker's event loop reads it; this
side's event loop writes it). The SDK's wire connection is thread-based; a broker's fetcher lives on its
event loop, so this is the small asyncio client it needs: the hello, then fetch frames and their answers,
strictly one at a time (nothing to route by lane).

It is an ``asyncio.Protocol``, not a stream reader: the answer is cut from the received bytes and parsed
inside the loop's read callback, and the fetch's future is resolved there, so the fetcher's task wakes
once per answer (a stream reader's ``readexactly`` pair and a task around it cost two more loop passes
and two objects per answer, on the path of every acks=all commit; docs/replication.md, "Fifth pass").

A cancelled fetch (the fetcher re-planned) leaves the stream mid-answer: the connection is closed and
the next fetch opens another.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import ssl
import time
from collections.abc import Callable
from typing import cast

from sluice.common.client_security import process_security
from sluice.common.client_tls import client_ssl_context, server_hostname
from sluice.common.wire import (
    CONNECT_TIMEOUT_S,
    PROTOCOL_VERSION,
    FrameReader,
    FrameType,
    WireProtocolError,
    error_from_frame,
    frame,
)
from sluice.errors import AuthenticationError, BrokerNotAvailable, SluiceError, raise_for_proto
from sluice.v1 import broker_pb2, wire_pb2

__all__ = ["ReplicaWire"]


#: Called with the next frame (``kind``, ``payload``, None) or, once the connection is over, with
#: (0, b"", the error).
FrameCallback = Callable[[int, bytes, BaseException | None], None]


class _Frames(asyncio.Protocol):
    """Cuts the connection's bytes into frames and hands each to the one waiting callback."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._reader = FrameReader()
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        #: Frames received that nobody waited for yet.
        self._ready: collections.deque[tuple[int, bytes]] = collections.deque()
        self._waiter: FrameCallback | None = None
        #: Why the connection is over (every later wait fails with it).
        self._error: BaseException | None = None
        #: When the latest frame was cut (``time.perf_counter``).
        self.read_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio's, but are one.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except SluiceError as exc:  # a hostile or broken length
            self._fail(exc)
            return
        for kind, payload in frames:
            if kind == FrameType.ERROR:
                self._fail(error_from_frame(payload, self._name))
                return
            self._ready.append((kind, payload))
        self.read_at = time.perf_counter()
        self._deliver()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._fail(BrokerNotAvailable(f"{self._name}: the connection closed"))

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        if self.transport is not None:
            self.transport.close()
        self._deliver()

    def _deliver(self) -> None:
        waiter = self._waiter
        if waiter is None:
            return
        if self._ready:
            self._waiter = None
            kind, payload = self._ready.popleft()
            waiter(kind, payload, None)
        elif self._error is not None:
            self._waiter = None
            waiter(0, b"", self._error)

    def expect(self, callback: FrameCallback) -> None:
        """``callback`` gets the next frame (now, if one came already)."""
        self._waiter = callback
        self._deliver()

    def next_frame(self) -> asyncio.Future[tuple[int, bytes]]:
        """The next frame, as a future."""
        fut: asyncio.Future[tuple[int, bytes]] = self._loop.create_future()

        def got(kind: int, payload: bytes, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result((kind, payload))

        self.expect(got)
        return fut


class ReplicaWire:
    """One greeted connection to a leader's wire port. Event-loop thread only."""

    def __init__(self, frames: _Frames, name: str) -> None:
        self._frames = frames
        self._name = name

    @property
    def read_at(self) -> float:
        """When the latest answer was read (``time.perf_counter``; the ``replica_apply`` stage)."""
        return self._frames.read_at

    @classmethod
    async def open(cls, host: str, port: int, broker_id: int) -> ReplicaWire:
        name = f"leader wire {host}:{port}"
        # The broker's own TLS and cluster token (set at its start), asked per connection.
        security = process_security()
        tls = security.tls
        loop = asyncio.get_running_loop()
        try:
            if tls is None:
                opening = loop.create_connection(lambda: _Frames(name), host, port)
            else:
                opening = loop.create_connection(
                    lambda: _Frames(name),
                    host,
                    port,
                    ssl=client_ssl_context(tls),
                    server_hostname=server_hostname(tls, host),
                )
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                transport, frames = await opening
        except ssl.SSLError as exc:
            raise AuthenticationError(f"{name}: TLS handshake failed: {exc.reason or exc}") from exc
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = cls(frames, name)
        try:
            hello = wire_pb2.WireHello(
                version=PROTOCOL_VERSION,
                client_id=f"broker-{broker_id}-replica",
                metadata=dict(security.metadata()),
            )
            transport.write(frame(FrameType.HELLO, hello.SerializeToString()))
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                kind, payload = await frames.next_frame()
            if kind != FrameType.HELLO:
                raise WireProtocolError(f"{name}: expected a hello answer, got frame type {kind}")
            raise_for_proto(wire_pb2.WireHelloResponse.FromString(payload).error)
        except BaseException:
            conn.close()
            raise
        return conn

    async def fetch(self, request: broker_pb2.FetchRequest) -> broker_pb2.FetchResponse:
        try:
            return await self.request(request)
        except asyncio.CancelledError:
            self.close()
            raise

    def request(self, request: broker_pb2.FetchRequest) -> asyncio.Future[broker_pb2.FetchResponse]:
        """Write the fetch frame now; the future is its answer, parsed in the read callback. Whoever
        cancels it closes the connection (the answer would arrive mid-stream of the next request):
        the fetcher does, on a re-plan and when it stops."""
        answer: asyncio.Future[broker_pb2.FetchResponse] = asyncio.get_running_loop().create_future()
        transport = self._frames.transport
        if transport is None or transport.is_closing():
            answer.set_exception(BrokerNotAvailable(f"{self._name}: the connection closed"))
            return answer
        transport.write(frame(FrameType.FETCH, request.SerializeToString()))
        name = self._name

        def got(kind: int, payload: bytes, error: BaseException | None) -> None:
            if answer.done():
                return  # abandoned: the connection is closed
            if error is not None:
                answer.set_exception(error)
            elif kind != FrameType.FETCH:
                self.close()
                answer.set_exception(
                    WireProtocolError(f"{name}: expected a fetch answer, got frame type {kind}")
                )
            else:
                try:
                    answer.set_result(broker_pb2.FetchResponse.FromString(payload))
                except Exception as exc:  # an answer that does not parse: the stream is not to be trusted
                    self.close()
                    answer.set_exception(WireProtocolError(f"{name}: a fetch answer did not parse: {exc}"))

        # Parsed in the read callback itself, so the fetcher's task wakes once, with the answer.
        self._frames.expect(got)
        return answer

    @property
    def closed(self) -> bool:
        transport = self._frames.transport
        return transport is None or transport.is_closing()

    def close(self) -> None:
        transport = self._frames.transport
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()
