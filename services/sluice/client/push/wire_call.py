"""A Consume stream over a dispatcher's wire port, shaped like the gRPC call it replaces.

``ConsumeStream`` iterates the call for ``DispatcherEvent``s on its own thread and cancels it
from others; so does it with :class:`WireConsumeCall`. Connecting happens on the first
iteration, on the stream's thread. A writer thread sends the session's commands as the
``Outbound`` yields them (acks are coalesced there, so it wakes a few times per batch of
messages, not per message) and half-closes the connection when they end, as a gRPC client
half-closes its stream (not over TLS: asyncio's TLS transport cannot keep a half-closed
connection open, so there the writer just stops, and a stop ends the call after its grace).
Failures raise typed errors: BrokerNotAvailable when a reconnect may
help, the dispatcher's own error when it refused the hello.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator

from google.protobuf.message import DecodeError

from sluice.client.wire import connect, hello_bytes, shutdown
from sluice.common.client_security import ClientSecurity, retriable_refusal
from sluice.common.client_tls import share
from sluice.common.wire import (
    CONNECT_TIMEOUT_S,
    PROTOCOL_VERSION,
    FrameReader,
    FrameType,
    error_from_frame,
    frame,
    split_address,
)
from sluice.errors import BrokerNotAvailable, CredentialsError
from sluice.v1 import dispatcher_pb2 as pb

__all__ = ["WireConsumeCall"]

_RECV_BYTES = 1 << 20


class WireConsumeCall:
    def __init__(
        self,
        address: str,
        commands: Iterator[pb.ConsumerCommand],
        client_id: str = "",
        security: ClientSecurity | None = None,
    ) -> None:
        self._address = address
        self._endpoint = split_address(address)
        self._commands = commands
        self._client_id = client_id
        self._security = security
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._cancelled = False

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            sock = self._sock
        shutdown(sock)

    def __iter__(self) -> Iterator[pb.DispatcherEvent]:
        name = f"dispatcher {self._address}"
        try:
            security = self._security
            hello = hello_bytes(PROTOCOL_VERSION, self._client_id, security)
            tls = security.tls if security is not None else None
            sock = connect(self._endpoint, hello, name, CONNECT_TIMEOUT_S, tls)
            share(sock)  # TLS: this thread reads while the writer thread sends
        except CredentialsError as exc:
            raise retriable_refusal(security, exc) from None
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
            shutdown(sock)
            sock.close()

    def _write(self, sock: socket.socket) -> None:
        """Send commands as the session produces them; half-close when it has no more."""
        with contextlib.suppress(OSError):  # the reader sees a broken connection too
            for command in self._commands:
                sock.sendall(frame(FrameType.CONSUME, command.SerializeToString()))
            if not isinstance(sock, ssl.SSLSocket):
                sock.shutdown(socket.SHUT_WR)
