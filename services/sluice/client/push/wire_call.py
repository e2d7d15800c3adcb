"""A Consume stream over a dispatcher's wire port, shaped like the gRPC call it replaces.

``ConsumeStream`` iterates the call for ``DispatcherEvent``s on its own thread and cancels it
from others; so does it with :class:`WireConsumeCall`. Connecting happens on the first
iteration, on the stream's thread. A writer thread sends the session's commands as the
``Outbound`` yields them (acks are coalesced there, so it wakes a few times per batch of
messages, not per message) and half-closes the connection when they end, as a gRPC client
half-closes its stream. Failures raise typed errors: BrokerNotAvailable when a reconnect may
help, the dispatcher's own error when it refused the hello.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from google.protobuf.message import DecodeError

from sluice.client.wire import connect
from sluice.common.wire import (
    CONNECT_TIMEOUT_S,
    PROTOCOL_VERSION,
    FrameReader,
    FrameType,
    error_from_frame,
    frame,
    split_address,
)
from sluice.errors import BrokerNotAvailable
from sluice.v1 import dispatcher_pb2 as pb
from sluice.v1 import wire_pb2

__all__ = ["WireConsumeCall"]

_RECV_BYTES = 1 << 20


class WireConsumeCall:
    def __init__(self, address: str, commands: Iterator[pb.ConsumerCommand], client_id: str = "") -> None:
        self._address = address
        self._endpoint = split_address(address)
        self._commands = commands
        self._hello = wire_pb2.WireHello(version=PROTOCOL_VERSION, client_id=client_id).SerializeToString()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __iter__(self) -> Iterator[pb.DispatcherEvent]:
        name = f"dispatcher {self._address}"
        try:
            sock = connect(self._endpoint, self._hello, name, CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise BrokerNotAvailable(f"{name}: {exc}") from exc
        with self._lock:
            self._sock = sock
            cancelled = self._cancelled
        try:
            if cancelled:
                return
            threading.Thread(
                target=self._write, args=(sock,), name="sluice-push-wire-writer", daemon=True
            ).start()
            reader = FrameReader()
            chunk = bytearray(_RECV_BYTES)
            view = memoryview(chunk)
            while n := sock.recv_into(chunk):
                for kind, payload in reader.feed(view[:n]):
                    if kind == FrameType.ERROR:
                        raise error_from_frame(payload, name)
                    if kind != FrameType.CONSUME:
                        raise BrokerNotAvailable(f"{name}: unexpected frame type {kind}")
                    yield pb.DispatcherEvent.FromString(payload)
        except (OSError, DecodeError) as exc:
            if not self._cancelled:
                raise BrokerNotAvailable(f"{name}: {exc!r}") from exc
        finally:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _write(self, sock: socket.socket) -> None:
        """Send commands as the session produces them; half-close when it has no more."""
        with contextlib.suppress(OSError):  # the reader sees a broken connection too
            for command in self._commands:
                sock.sendall(frame(FrameType.CONSUME, command.SerializeToString()))
            sock.shutdown(socket.SHUT_WR)
