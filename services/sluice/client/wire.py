"""Connecting to a wire port: the hello, shared by the SDK's broker connection
(``client.shared_wire``) and the push consumer's wire call (``client.push.wire_call``).

The hello is the first frame either way (``docs/wire.md``): the client's version and
credentials out, the server's version (or its typed refusal: ``Unauthenticated``, ...) back.
After it the socket blocks for good, with no Nagle delay: every frame is a whole request.
"""

from __future__ import annotations

import contextlib
import socket

from sluice.common.wire import FrameReader, FrameType, WireProtocolError, error_from_frame, frame
from sluice.errors import BrokerNotAvailable, raise_for_proto
from sluice.v1 import wire_pb2

__all__ = ["connect", "greet", "greet_and_block", "shutdown"]

#: What one receive of the hello's answer asks for (the answer is a few bytes).
_HELLO_RECV_BYTES = 1 << 16


def greet(sock: socket.socket, hello: bytes, name: str) -> wire_pb2.WireHelloResponse:
    """Send the hello and read its answer; a refusal raises its typed error (Unauthenticated...)."""
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


def connect(endpoint: tuple[str, int], hello: bytes, name: str, timeout: float) -> socket.socket:
    """A connected, greeted, blocking socket."""
    sock = socket.create_connection(endpoint, timeout=timeout)
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
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
