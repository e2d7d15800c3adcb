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
import time
from typing import Any, cast

from sluice.common.wire import (
    PROTOCOL_VERSION,
    FrameReader,
    FrameTooLarge,
    FrameType,
    Payload,
    WireProtocolError,
    frame_parts,
    parse_frame,
)
from sluice.errors import AuthenticationError, InvalidRequest, SluiceError
from sluice.security.audit import audit_unauthenticated
from sluice.security.authenticate import ANONYMOUS_CALLER, Authenticated
from sluice.security.context import WIRE, RequestContext
from sluice.security.live_streams import LiveStream
from sluice.security.model import ANONYMOUS
from sluice.security.service import lower_keys
from sluice.server.config import ConnectionSettings
from sluice.server.limits import set_tcp_keepalive
from sluice.server.metrics import count_internal_error
from sluice.server.wire_buffer import (
    FRAME_BUFFER_MIN,
    READ_BUFFER_HELLO,
    READ_BUFFER_MAX,
    READ_BUFFER_MIN,
    next_buffer_size,
)
from sluice.server.wire_listener import WireListener
from sluice.v1 import wire_pb2

__all__ = ["READ_BUFFER_MAX", "READ_BUFFER_MIN", "WireConnection", "WireListener"]

log = logging.getLogger(__name__)

#: Requests one connection may have queued or owe answers to; past this it is not read from
#: (a wire connection, or a Broker.ProduceStream call under flush=always).
MAX_BACKLOG = 64


class WireConnection(asyncio.BufferedProtocol):
    """One client connection. Everything here runs on the event loop thread.

    A buffered protocol: the loop reads into this connection's own buffer (``get_buffer``), so
    a read allocates nothing; the frame reader copies out only what it keeps. The buffer starts
    at ``READ_BUFFER_MIN``, grows (up to ``READ_BUFFER_MAX``) while a large frame arrives or reads
    fill it, and shrinks back when a read that fits the small one ends on a frame boundary.

    A service that budgets the frames it is sent (``preallocates_frames``: the broker's produce
    pool) has the rest of a large frame read straight into that frame's own buffer instead, once
    ``frame_buffer_allowed`` says its budget holds the frame (``docs/wire.md``, "Receiving a large
    frame"): the receive buffer then stays small, and the payload is handed on without a copy.
    """

    #: Where the receive buffer starts and shrinks back to; a service whose connections carry
    #: only small frames sets less (the dispatcher's push consumers: ``dispatcher/wire_server.py``).
    read_buffer_min = READ_BUFFER_MIN
    #: Whether this service reads large frames into their own buffers (``frame_buffer_allowed``).
    preallocates_frames = False

    def __init__(self, listener: WireListener) -> None:
        self.listener = listener
        # The first frame (the hello, before authentication) is capped by max_hello_bytes.
        self._reader = FrameReader(listener.max_frame_bytes, listener.limits.max_hello_bytes)
        self._view = memoryview(bytearray(min(READ_BUFFER_HELLO, self.read_buffer_min)))
        #: The last buffer handed to the loop was the unfilled part of a frame's own buffer.
        self._into_frame = False
        #: Monotonic times: accepted, last bytes received, and when the frame now partly received
        #: began (0.0: none), for the listener's deadlines (``overdue``).
        self.opened_at = self.last_read = time.monotonic()
        self.frame_started = 0.0
        self._admitted = False
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

    def on_frame(self, kind: int, payload: Payload) -> None:
        """A frame after the hello. Raise a SluiceError to end the connection with it. A large
        frame received into its own buffer comes as that ``bytearray`` (no copy made of it)."""
        raise WireProtocolError(f"unknown frame type {kind}")

    def backlog(self) -> int:
        """Work queued or answers owed on this connection (reading pauses at MAX_BACKLOG)."""
        return 0

    def opened(self) -> None:
        """The hello was accepted."""

    def frame_buffer_allowed(self) -> bool:
        """Whether the frame whose header just arrived may have its whole declared size allocated
        now (``preallocates_frames`` services): a peer's 5 bytes then cost that allocation, so a
        service allows it only within a budget it has taken for the frame (the broker's pool)."""
        return False

    def reading_held(self) -> bool:
        """A service's own reason not to read now (the broker's memory budget, ``docs/memory.md``);
        it calls ``update_reading`` when the reason goes away."""
        return False

    @property
    def frame_in_progress(self) -> int:
        """The whole size (length prefix included) of the frame begun in the receive buffer and
        not yet complete; 0: none begun (or its length not read yet)."""
        missing = self._reader.missing
        return self._reader.buffered + missing if missing > 0 else 0

    @property
    def ssl_object(self) -> Any:
        """The TLS session on a TLS port (None on plaintext): its ``getpeercert()`` is the client's
        verified certificate, for ``PrincipalMapper.principal_from_peer_cert``."""
        transport = self.transport
        return transport.get_extra_info("ssl_object") if transport is not None else None

    def lost(self) -> None:
        """The connection is gone: stop its work."""

    def busy(self) -> bool:
        """Work is in flight (an answer owed, a fetch followed, a stream served): the connection is
        not idle however long the client stays silent (the service may be the one to speak)."""
        return self.backlog() > 0

    # ---- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport, so no isinstance).
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        #: The peer's host alone: failed authentications are counted per host (a client picks a
        #: new port per connection).
        self.host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        refused = self.listener.gate.admit(self)
        if refused is not None:
            self.listener.metrics.closed_for("limit")
            log.warning("wire connection from %s refused: %s", self.peer, refused.message)
            self.write(FrameType.ERROR, refused.to_proto().SerializeToString())
            self.close()
            return
        self._admitted = True
        set_tcp_keepalive(transport.get_extra_info("socket"), self.listener.limits)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self._admitted:
            self._admitted = False
            self.listener.gate.release(self)
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
        reader = self._reader
        if reader.receiving_frame or (
            self.preallocates_frames and reader.missing >= FRAME_BUFFER_MIN and self.frame_buffer_allowed()
        ):
            into = reader.frame_buffer()
            if into is not None:
                self._into_frame = True
                return into
        self._into_frame = False
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self.last_read = now = time.monotonic()
        if self._into_frame:
            self._into_frame = False
            self._frames_in(None, nbytes)
        else:
            self._frames_in(self._view[:nbytes], nbytes)
            self._size_buffer(nbytes)
        if not self._reader.buffered:
            self.frame_started = 0.0
        elif not self.frame_started:
            self.frame_started = now

    def eof_received(self) -> bool | None:
        """The peer half-closed. In the middle of a frame that frame can never complete: an error
        frame, then close (both services; a client that sent half a frame and FIN must not hold the
        connection); before the hello, silently. Otherwise asyncio closes the transport (None)."""
        if self._reader.buffered and not self.closing:
            self.listener.metrics.closed_for("half_frame")
            at = self._reader.buffered
            if self._greeted:  # before the hello nothing is said, as to any client not yet greeted
                self.fail(InvalidRequest(f"the connection was half-closed {at} bytes into a frame"))
            else:
                log.info("wire connection from %s closed: half-closed %d bytes into its hello", self.peer, at)
                self.close()
            return False
        return None

    def overdue(self, now: float, limits: ConnectionSettings) -> str | None:
        """Why the connection is past a deadline at ``now`` (a ``CLOSE_REASONS`` entry), or None."""
        if self.closing:
            return None
        if not self._greeted:
            # While a hello's credentials are verified the wait is the service's, not the client's.
            late = self._held is None and now - self.opened_at > limits.hello_timeout.total_seconds()
            return "pre_auth_timeout" if late else None
        if self._reading_paused:
            return None  # the service is not reading: nothing the client sends can arrive
        if self.frame_started and now - self.frame_started > limits.frame_timeout.total_seconds():
            return "frame_timeout"
        if now - self.last_read > limits.connections_max_idle.total_seconds() and not self.busy():
            return "idle"
        return None

    def drop(self, reason: str) -> None:
        """Close for a deadline missed: silently when idle (a client reconnects when it next needs
        the connection, as with Kafka's connections.max.idle.ms), else with an error frame."""
        self.listener.metrics.closed_for(reason)
        if reason == "idle":
            log.debug("wire connection from %s closed: idle", self.peer)
            self.close()
            return
        limits = self.listener.limits
        why = {
            "pre_auth_timeout": f"no hello within {limits.hello_timeout.total_seconds():g} s",
            "frame_timeout": f"a frame not complete within {limits.frame_timeout.total_seconds():g} s",
        }.get(reason, reason)
        self.fail(InvalidRequest(why))

    @property
    def in_hello(self) -> bool:
        """A hello is being authenticated (the frames after it are held until it is done)."""
        return self._held is not None

    @property
    def read_buffer_bytes(self) -> int:
        """The size of the receive buffer now (it grows and shrinks, see the class docstring)."""
        return len(self._view)

    def _size_buffer(self, nbytes: int) -> None:
        reader = self._reader
        # A large frame's rest will be read into its own buffer: growing this one would not help it.
        direct = self.preallocates_frames and self._greeted and reader.missing >= FRAME_BUFFER_MIN
        wanted = next_buffer_size(len(self._view), nbytes, reader, self.read_buffer_min, direct)
        if wanted is not None:
            self._view = memoryview(bytearray(wanted))  # one allocation per change of size

    def data_received(self, data: bytes | memoryview) -> None:
        self._frames_in(data, len(data))

    def _frames_in(self, data: bytes | memoryview | None, nbytes: int) -> None:
        """Handle the frames a read completed: ``data`` (None: ``nbytes`` went into the frame's own
        buffer, ``get_buffer``)."""
        if self.closing:
            return
        reader = self._reader
        try:
            frames: list[tuple[int, bytes]] | list[tuple[int, bytearray]]
            frames = reader.feed(data) if data is not None else reader.frame_filled(nbytes)
            for kind, payload in frames:
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
            self._count_failure(err)
            self.fail(err)
            return
        except Exception:  # a bug, not bad input: counted (docs/limits.md, "Typed errors"), logged once
            count_internal_error(self.listener.service, "wire")
            log.exception("wire connection from %s: internal error", self.peer)
            self.fail(SluiceError("internal error"))
            return
        self.update_reading()

    def _count_failure(self, err: SluiceError) -> None:
        if isinstance(err, FrameTooLarge):
            self.listener.metrics.closed_for("pre_auth_too_large" if err.first else "too_large")
        else:
            self.listener.metrics.closed_for("protocol")

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
        pause = (
            self._writing_paused
            or self._held is not None
            or self.backlog() >= MAX_BACKLOG
            or self.reading_held()
        )
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()
                if self.frame_started:
                    # The time reading was paused was the service's: the frame's clock restarts.
                    self.frame_started = time.monotonic()

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
        if len(self._view) < self.read_buffer_min:
            # Authenticated: the buffer a service's connections read into (the hello's was smaller).
            self._view = memoryview(bytearray(self.read_buffer_min))
        listener.connections_gauge.inc()
        answer = wire_pb2.WireHelloResponse(version=self.version, max_frame_bytes=listener.max_frame_bytes)
        self.write(FrameType.HELLO, answer.SerializeToString())
        self.opened()
