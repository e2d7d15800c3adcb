"""The server side of the wire protocol (``docs/wire.md``), shared by the broker and the dispatcher.

:class:`WireListener` accepts connections; each is a :class:`WireConnection`, an
``asyncio.BufferedProtocol``: the event loop reads into its buffer and it cuts the bytes into
frames itself, so a frame costs no task switch and no thread hand-off. This module owns what
every wire connection does alike: the hello (version; authentication, which gives the connection
its caller's context), protocol errors (an error frame, then close), writing frames, and
back-pressure (stop reading while the service's work for this connection piles up or the peer
does not read). A service subclasses
:class:`WireConnection` for what its frames mean (``on_frame``, ``backlog``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, cast

from google.protobuf.message import DecodeError
from prometheus_client import Gauge

from sluice.common.wire import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    FrameReader,
    FrameType,
    WireProtocolError,
    frame_parts,
)
from sluice.errors import AuthenticationError, InvalidRequest, SluiceError
from sluice.security.audit import audit_unauthenticated
from sluice.security.authenticate import ANONYMOUS_CALLER, Authenticated
from sluice.security.context import WIRE, RequestContext
from sluice.security.live_streams import LiveStream
from sluice.security.model import ANONYMOUS
from sluice.security.service import ServiceSecurity, lower_keys
from sluice.security.tls import ServerTLS
from sluice.v1 import wire_pb2

__all__ = ["WireConnection", "WireListener", "parse_frame"]

log = logging.getLogger(__name__)

#: Requests one connection may have queued or owe answers to; past this it is not read from
#: (a wire connection, or a Broker.ProduceStream call under flush=always).
MAX_BACKLOG = 64

_GAUGES: dict[str, Gauge] = {}


def _connections_gauge(service: str) -> Gauge:
    """``sluice_<service>_wire_connections``: one per service and process (the default registry)."""
    name = f"sluice_{service.replace('-', '_')}_wire_connections"
    gauge = _GAUGES.get(name)
    if gauge is None:
        gauge = _GAUGES[name] = Gauge(name, "Open wire-protocol connections (past the hello)")
    return gauge


class WireListener:
    """Listens on a service's wire port. ``start()`` returns the bound port; ``stop()`` is idempotent."""

    def __init__(
        self,
        service: str,
        connection: Callable[[WireListener], WireConnection],
        host: str,
        port: int,
        security: ServiceSecurity | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        version: int = PROTOCOL_VERSION,
        tls: ServerTLS | None = None,
    ) -> None:
        self.service = service
        #: TLS on this port (None: plaintext). A connection's peer certificate, for the
        #: authenticator: ``transport.get_extra_info("ssl_object")``.
        self.tls = tls
        #: The highest protocol version this service speaks (a connection speaks the lower of
        #: it and the client's).
        self.version = version
        self._connection = connection
        self.host = host
        self.port = port
        #: None when nothing is checked (no authentication, no authorization).
        self.security = security if security is not None and security.active else None
        self.max_frame_bytes = max_frame_bytes
        self.bound_port = 0
        self.connections: set[WireConnection] = set()
        self.connections_gauge = _connections_gauge(service)
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        tls = self.tls
        if tls is None:
            self._server = await loop.create_server(lambda: self._connection(self), self.host, self.port)
        else:
            self._server = await loop.create_server(
                lambda: self._tls_connection(tls), self.host, self.port, ssl=tls.ssl_context()
            )
        self.bound_port = self._server.sockets[0].getsockname()[1]
        return self.bound_port

    def _tls_connection(self, tls: ServerTLS) -> WireConnection:
        """A connection on a TLS port: the certificate files are checked for a change first (once a
        second at most), so this handshake and later ones present a rotated certificate."""
        tls.maybe_reload()
        return self._connection(self)

    async def stop(self) -> None:
        """Stop accepting, then close every connection (after what was already written)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self.connections):
            conn.close()


#: A connection's receive buffer, as it starts and as it returns to once a burst has passed. Most
#: connections only ever carry small frames (a push consumer's flow and acks, a fetch request), and
#: a dispatcher holds one per push consumer: 16 KiB, not 256, is what keeps 1,000 of them cheap
#: (``docs/dispatcher.md``, "What a consumer costs").
READ_BUFFER_MIN = 16 * 1024
#: The most one socket read may bring: the buffer grows to it for a large frame, or while reads
#: fill the buffer (a peer that streams), so a large produce batch takes as few reads as before.
READ_BUFFER_MAX = 256 * 1024


class WireConnection(asyncio.BufferedProtocol):
    """One client connection. Everything here runs on the event loop thread.

    A buffered protocol: the loop reads into this connection's own buffer (``get_buffer``), so
    a read allocates nothing; the frame reader copies out only what it keeps. The buffer starts
    at ``READ_BUFFER_MIN``, grows (up to ``READ_BUFFER_MAX``) while a large frame arrives or reads
    fill it, and shrinks back when a read that fits the small one ends on a frame boundary.
    """

    #: Where the receive buffer starts and shrinks back to; a service whose connections carry
    #: only small frames sets less (the dispatcher's push consumers: ``dispatcher/wire_server.py``).
    read_buffer_min = READ_BUFFER_MIN

    def __init__(self, listener: WireListener) -> None:
        self.listener = listener
        self._reader = FrameReader(listener.max_frame_bytes)
        self._view = memoryview(bytearray(self.read_buffer_min))
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.host = "?"
        self._greeted = False
        #: The protocol version agreed at the hello.
        self.version = PROTOCOL_VERSION
        #: The hello's client id (quotas key anonymous callers by it).
        self.client_id = ""
        self.closing = False
        #: The caller, once the hello is accepted (authenticated): every request's context.
        self.ctx = RequestContext(ANONYMOUS, WIRE)
        self._stream: LiveStream | None = None
        #: Frames that arrived while the hello's credentials were being verified (a JWT not seen
        #: before may need the issuer's keys): run once it is accepted. None: not waiting.
        self._held: list[tuple[int, bytes]] | None = None
        self._reading_paused = False
        self._writing_paused = False
        #: Set while the transport takes writes; producers of large answers wait on it, so a
        #: client that does not read holds at most one such answer in the service's memory.
        self.writable = asyncio.Event()
        self.writable.set()

    # ---- what a service defines -----------------------------------------------------------

    def on_frame(self, kind: int, payload: bytes) -> None:
        """A frame after the hello. Raise a SluiceError to end the connection with it."""
        raise WireProtocolError(f"unknown frame type {kind}")

    def backlog(self) -> int:
        """Work queued or answers owed on this connection (reading pauses at MAX_BACKLOG)."""
        return 0

    def opened(self) -> None:
        """The hello was accepted."""

    @property
    def ssl_object(self) -> Any:
        """The TLS session on a TLS port (None on plaintext): its ``getpeercert()`` is the client's
        verified certificate, for ``PrincipalMapper.principal_from_peer_cert``."""
        transport = self.transport
        return transport.get_extra_info("ssl_object") if transport is not None else None

    def lost(self) -> None:
        """The connection is gone: stop its work."""

    # ---- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport, so no isinstance).
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        #: The peer's host alone: failed authentications are counted per host (a client picks a
        #: new port per connection).
        self.host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        self.listener.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.listener.connections.discard(self)
        self.writable.set()  # nothing waits for a transport that is gone
        if self._stream is not None and self.listener.security is not None:
            self.listener.security.streams.close(self._stream)
        if self._greeted:
            self.listener.connections_gauge.dec()
            self.lost()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self.writable.clear()
        self.update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.writable.set()
        self.update_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._view[:nbytes])
        self._size_buffer(nbytes)

    @property
    def in_hello(self) -> bool:
        """A hello is being authenticated (the frames after it are held until it is done)."""
        return self._held is not None

    @property
    def read_buffer_bytes(self) -> int:
        """The size of the receive buffer now (it grows and shrinks, see the class docstring)."""
        return len(self._view)

    def _size_buffer(self, nbytes: int) -> None:
        """Size the next read: larger while a large frame is incomplete or the last read filled
        the buffer (more is waiting), back to the minimum once a small read ended on a frame
        boundary. A new buffer costs one allocation per change of size, never one per read."""
        size = len(self._view)
        missing = self._reader.missing
        if nbytes == size or missing > size:
            wanted = min(READ_BUFFER_MAX, max(2 * size, missing))
        elif size > (low := self.read_buffer_min) and nbytes <= low and not self._reader.buffered:
            wanted = low
        else:
            return
        if wanted != size:
            self._view = memoryview(bytearray(wanted))

    def data_received(self, data: bytes | memoryview) -> None:
        if self.closing:
            return
        try:
            for kind, payload in self._reader.feed(data):
                if self.closing:
                    return
                if self._held is not None:
                    self._held.append((kind, bytes(payload)))
                elif self._greeted:
                    if kind == FrameType.HELLO:
                        raise WireProtocolError("a second hello on one connection")
                    self.on_frame(kind, payload)
                elif kind == FrameType.HELLO:
                    self._hello(parse_frame(wire_pb2.WireHello, payload, "hello"))
                else:
                    raise WireProtocolError(f"the first frame must be a hello (type 1), got type {kind}")
        except SluiceError as err:
            self.fail(err)
            return
        self.update_reading()

    # ---- for subclasses -------------------------------------------------------------------

    def write(self, kind: FrameType, payload: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.writelines(frame_parts(kind, payload))

    @property
    def takes_writes(self) -> bool:
        """Whether an answer written now goes out (the peer reads, the connection is open)."""
        return not self._writing_paused and not self.closing

    def update_reading(self) -> None:
        """Read only while this connection's work keeps up (see the module docstring)."""
        transport = self.transport
        if transport is None or self.closing:
            return
        pause = self._writing_paused or self._held is not None or self.backlog() >= MAX_BACKLOG
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def fail(self, err: SluiceError) -> None:
        """The peer broke the protocol: say why in an error frame, then close."""
        log.info("wire connection from %s closed: %s", self.peer, err.message)
        self.write(FrameType.ERROR, err.to_proto().SerializeToString())
        self.close()

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    # ---- the hello ------------------------------------------------------------------------

    def _hello(self, hello: wire_pb2.WireHello) -> None:
        if hello.version < 1:
            raise WireProtocolError(
                f"protocol version {hello.version} is not supported (this server speaks 1)"
            )
        self.version = min(hello.version, self.listener.version)
        self.client_id = hello.client_id[:256]  # for quotas (docs/quotas.md); bounded, it is echoed
        security = self.listener.security
        if security is None:
            self._greet(ANONYMOUS_CALLER)
            return
        metadata = lower_keys(hello.metadata.items())
        cert = None
        if security.wire_cert_principal is not None and self.transport is not None:
            cert = security.wire_cert_principal(self.transport.get_extra_info("ssl_object"))
        try:
            who = security.authenticator.authenticate_now(metadata, cert, self.host)
        except SluiceError as err:
            self._refuse(err)
            return
        if who is not None:
            self._greet(who)
            return
        # Verifying needs to wait (a JWT whose key is not cached): hold what follows until then.
        self._held = []
        verify = security.authenticator.authenticate(metadata, cert, self.host)
        task = asyncio.get_running_loop().create_task(verify, name=f"wire-hello-{self.peer}")
        task.add_done_callback(self._verified)

    def _verified(self, task: asyncio.Task[Authenticated]) -> None:
        held, self._held = self._held or [], None
        if self.closing or task.cancelled():
            return
        err = task.exception()
        if err is not None:
            self._refuse(
                err if isinstance(err, SluiceError) else AuthenticationError("authentication failed")
            )
            return
        self._greet(task.result())
        try:
            for kind, payload in held:
                if self.closing:
                    return
                self.on_frame(kind, payload)
        except SluiceError as exc:
            self.fail(exc)
            return
        self.update_reading()

    def _refuse(self, err: SluiceError) -> None:
        audit_unauthenticated(self.listener.service, self.peer, err)
        answer = wire_pb2.WireHelloResponse(
            version=self.version, max_frame_bytes=self.listener.max_frame_bytes
        )
        answer.error.CopyFrom(err.to_proto())
        self.write(FrameType.HELLO, answer.SerializeToString())
        log.info("wire connection from %s refused: %s", self.peer, err.message)
        self.close()

    def _greet(self, who: Authenticated) -> None:
        listener = self.listener
        security = listener.security
        if security is not None:
            self._stream = security.streams.open(
                who.principal, self.peer, who.expires_at, who.credentials, self.fail
            )
        self.ctx = RequestContext(
            who.principal, WIRE, address=self.peer, stream=self._stream, client_id=self.client_id
        )
        self._greeted = True
        listener.connections_gauge.inc()
        answer = wire_pb2.WireHelloResponse(version=self.version, max_frame_bytes=listener.max_frame_bytes)
        self.write(FrameType.HELLO, answer.SerializeToString())
        self.opened()


def parse_frame(message_type: Any, payload: bytes, what: str) -> Any:
    """A frame's protobuf payload; InvalidRequest (ending the connection) when it does not parse."""
    try:
        return message_type.FromString(payload)
    except DecodeError as exc:
        raise InvalidRequest(f"a {what} frame that is not a valid {message_type.__name__}: {exc}") from exc
