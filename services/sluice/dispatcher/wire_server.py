"""The dispatcher's wire-protocol connections: one Consume stream per connection (``docs/wire.md``).

A connection carries exactly what one ``Dispatcher.Consume`` gRPC stream carries, and is served
by the same servicer code (``DispatcherServicer.consume_into``, with the connection's
``RequestContext``), so a command reaches the same core call and fails with the same typed
error. Consume frames from the client become the servicer's command iterator, and every event
the service sends is written as a consume frame right away, with no queue or task between
(message batches are already encoded; they are written as they are). For a push consumer this
replaces grpcio's thread hand-offs on both sides with one socket read per batch (the broker's
wire port exists for the same reason; ``docs/wire.md`` has the measurements).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from sluice.common.wire import FrameType, Payload, WireProtocolError, parse_frame
from sluice.dispatcher.events import Outgoing
from sluice.dispatcher.servicer import DispatcherServicer
from sluice.security.service import ServiceSecurity
from sluice.security.tls import ServerTLS
from sluice.server.wire import WireConnection, WireListener
from sluice.v1 import dispatcher_pb2 as pb

__all__ = ["dispatcher_wire_listener"]

log = logging.getLogger(__name__)


def dispatcher_wire_listener(
    servicer: DispatcherServicer,
    host: str,
    port: int,
    security: ServiceSecurity | None = None,
    tls: ServerTLS | None = None,
) -> WireListener:
    def connection(listener: WireListener) -> WireConnection:
        return _ConsumeConnection(listener, servicer)

    return WireListener("dispatcher", connection, host, port, security, tls=tls)


class _ConsumeConnection(WireConnection):
    #: A push consumer sends Flow and Ack frames of tens to hundreds of bytes (acks by ranges),
    #: and the dispatcher holds one connection per consumer: 4 KiB, not 16, per consumer. A larger
    #: frame grows the buffer for as long as it takes (``server/wire.py``); docs/dispatcher.md,
    #: "What a subscription costs".
    read_buffer_min = 4 * 1024

    def __init__(self, listener: WireListener, servicer: DispatcherServicer) -> None:
        super().__init__(listener)
        self._servicer = servicer
        #: Commands read and not yet taken by the servicer; None ends them (the client is gone).
        self._commands: asyncio.Queue[pb.ConsumerCommand | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        #: A command arrived: a Consume stream is served (``busy``).
        self._commanded = False

    def backlog(self) -> int:
        return self._commands.qsize()

    def busy(self) -> bool:
        """A stream is served once a command arrived: a push consumer waiting for messages sends
        nothing for as long as none come, and is not idle (TCP keepalive finds a vanished one). A
        connection that said hello and nothing since is, and is closed after the idle timeout."""
        return self._commanded

    def opened(self) -> None:
        """The hello was accepted: its context (the authenticated principal) is the stream's."""
        serve = self._servicer.consume_into(
            self.ctx, self._command_iterator(), f"wire:{self.peer}", self._send
        )
        self._task = asyncio.get_running_loop().create_task(serve, name=f"consume-wire-{self.peer}")

    def lost(self) -> None:
        self._commands.put_nowait(None)

    def eof_received(self) -> bool:
        """The consumer half-closed (a graceful stop, its acks sent): end the commands, and keep
        the connection open until the servicer ends the stream. Before a hello was accepted there is
        no stream to end: close now, or a client that sent half a frame (or no hello) and FIN would
        hold the connection for good (found by the fuzz suite)."""
        if super().eof_received() is False:
            return False  # half a frame, then FIN: closed with an error frame (``server/wire.py``)
        if self._task is None and not self.in_hello:
            return False  # asyncio closes the transport
        self._commands.put_nowait(None)
        return True

    def on_frame(self, kind: int, payload: Payload) -> None:
        if kind != FrameType.CONSUME:
            raise WireProtocolError(f"unknown frame type {kind} (a dispatcher takes consume frames, type 4)")
        self._commands.put_nowait(parse_frame(pb.ConsumerCommand, payload, "consume"))
        self._commanded = True

    async def _command_iterator(self) -> AsyncIterator[pb.ConsumerCommand]:
        commands = self._commands
        while True:
            command = await commands.get()
            if command is None:
                return
            yield command
            # This frame must not hold the last command while it waits for the next: a parsed command
            # keeps its upb arena (~40 KB for an Ack by ranges after a burst; servicer._read).
            del command
            self.update_reading()

    def _send(self, event: Outgoing) -> None:
        """The servicer's sink: write each event at once (permits bound what a consumer is sent);
        the end of the stream closes the connection, after what was written."""
        if event is None:
            self.close()
        else:
            self.write(FrameType.CONSUME, event if isinstance(event, bytes) else event.SerializeToString())
