"""Connecting to a wire port: the hello, shared by the SDK's broker connection
(``client.shared_wire``) and the push consumer's wire call (``client.push.wire_call``).

The hello is the first frame either way (``docs/wire.md``): the client's version and
credentials out, the server's version (or its typed refusal: ``Unauthenticated``, ...) back.
After it the socket blocks for good, with no Nagle delay: every frame is a whole request.

TLS (``open_socket`` with a :class:`TLSConfig`): the socket is wrapped before the hello, and a
handshake that fails (the server's certificate does not verify, the server refused this client's)
is an ``AuthenticationError``, not a retriable one. The hello's metadata (the token) is built per
connection (:func:`hello_bytes`), so every new connection carries a fresh token.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl

from google.protobuf.message import DecodeError

from sluice.common.client_security import ClientSecurity, TLSConfig
from sluice.common.client_tls import client_ssl_context, server_hostname
from sluice.common.wire import FrameReader, FrameType, WireProtocolError, error_from_frame, frame
from sluice.errors import AuthenticationError, BrokerNotAvailable, SluiceError, raise_for_proto
from sluice.v1 import wire_pb2

__all__ = [
    "connect",
    "connection_failure",
    "greet",
    "greet_and_block",
    "hello_bytes",
    "open_socket",
    "shutdown",
    "tls_refused",
]

log = logging.getLogger("sluice.client.wire")

#: What one receive of the hello's answer asks for (the answer is a few bytes).
_HELLO_RECV_BYTES = 1 << 16


def hello_bytes(version: int, client_id: str, security: ClientSecurity | None) -> bytes:
    """A hello carrying ``security``'s metadata (its token source is asked now)."""
    metadata = dict(security.metadata()) if security is not None else {}
    return wire_pb2.WireHello(version=version, client_id=client_id, metadata=metadata).SerializeToString()


def tls_refused(name: str, exc: ssl.SSLError) -> AuthenticationError:
    return AuthenticationError(f"{name}: TLS handshake failed: {exc.reason or exc}")


def open_socket(endpoint: tuple[str, int], timeout: float, tls: TLSConfig | None, name: str) -> socket.socket:
    """A connected socket (TLS-wrapped and handshaken when ``tls``), the connect timeout set."""
    sock = socket.create_connection(endpoint, timeout=timeout)
    if tls is None:
        return sock
    try:
        # No ragged EOFs: an end without close_notify raises (SSLEOFError), so a refusal at the
        # hello is told from an orderly close.
        return client_ssl_context(tls).wrap_socket(
            sock, server_hostname=server_hostname(tls, endpoint[0]), suppress_ragged_eofs=False
        )
    except ssl.SSLError as exc:
        sock.close()
        raise tls_refused(name, exc) from exc
    except BaseException:
        sock.close()
        raise


def greet(sock: socket.socket, hello: bytes, name: str) -> wire_pb2.WireHelloResponse:
    """Send the hello and read its answer; a refusal raises its typed error (Unauthenticated...)."""
    try:
        return _greet(sock, hello, name)
    except (ssl.SSLError, ConnectionError) as exc:
        if not isinstance(sock, ssl.SSLSocket):
            raise
        # TLS 1.3: the server checks the client's certificate after the client's handshake is done,
        # and a refusal ends the connection with no alert (asyncio's TLS transport does not flush
        # one): an abrupt end (no close_notify, or a reset) before the hello's answer is that.
        raise AuthenticationError(
            f"{name}: the server ended the TLS session at the hello ({exc}): it refused this "
            "client's certificate, or requires one"
        ) from exc


def _greet(sock: socket.socket, hello: bytes, name: str) -> wire_pb2.WireHelloResponse:
    sock.sendall(frame(FrameType.HELLO, hello))
    reader = FrameReader()
    answer: wire_pb2.WireHelloResponse | None = None
    while answer is None:
        data = sock.recv(_HELLO_RECV_BYTES)
        if not data:
            raise BrokerNotAvailable(f"{name}: the server closed the connection at the hello")
        for kind, payload in reader.feed(data):
            if kind == FrameType.ERROR:
                raise error_from_frame(payload, name)
            if kind != FrameType.HELLO:
                raise WireProtocolError(f"{name}: expected a hello answer, got frame type {kind}")
            answer = wire_pb2.WireHelloResponse.FromString(payload)
    raise_for_proto(answer.error)
    return answer


def connect(
    endpoint: tuple[str, int], hello: bytes, name: str, timeout: float, tls: TLSConfig | None = None
) -> socket.socket:
    """A connected, greeted, blocking socket."""
    sock = open_socket(endpoint, timeout, tls, name)
    try:
        greet_and_block(sock, hello, name)
    except BaseException:
        sock.close()
        raise
    return sock


def greet_and_block(sock: socket.socket, hello: bytes, name: str) -> None:
    """A new connection: no Nagle delay (every frame is a whole request), the hello (within the
    connect timeout still set on the socket), then blocking for good."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    greet(sock, hello, name)
    sock.settimeout(None)


def shutdown(sock: socket.socket | None) -> None:
    """End the connection from any thread: blocked reads and writes return. On a TLS socket the
    descriptor is shut down directly: ``SSLSocket.shutdown`` first drops the TLS layer, and a
    frame another thread sends in that moment would go out unencrypted."""
    if sock is not None:
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


def connection_failure(name: str, exc: SluiceError | OSError | DecodeError) -> SluiceError:
    """What the requests a failed connection (``client.shared_wire``) owes fail with."""
    if isinstance(exc, WireProtocolError):
        # The broker broke the protocol (never expected): what waits may succeed on a new
        # connection, so it fails retriable, as an unreachable broker's requests do.
        log.error("%s: %s; reconnecting", name, exc.message)
        return BrokerNotAvailable(f"{name}: {exc.message}")
    if isinstance(exc, SluiceError):
        return exc
    return BrokerNotAvailable(f"{name}: {exc}")
