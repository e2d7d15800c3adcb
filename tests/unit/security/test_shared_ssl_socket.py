"""``SharedSSLSocket``: one reader thread and a writer thread on one TLS session, as the SDK's wire
connections use it; neither waits for the other while the peer makes it wait (no deadlock), and every
byte arrives in order both ways."""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import threading
from pathlib import Path

from sluice.common.client_security import TLSConfig
from sluice.common.client_tls import SharedSSLSocket, client_ssl_context, share
from sluice.security import certs

SIZE = 4 * 1024 * 1024  # far more than the socket buffers hold: each side's writes block for a while


def _server(listener: socket.socket, context: ssl.SSLContext, to_client: bytes, got: list[bytes]) -> None:
    """Send everything before reading anything, then read what the client sent."""
    raw, _ = listener.accept()
    with context.wrap_socket(raw, server_side=True) as sock:
        sock.sendall(to_client)
        data = bytearray()
        while len(data) < SIZE:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
        got.append(bytes(data))


def test_a_blocked_writer_does_not_stop_the_reader(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    pair = certs.issue(ca, tmp_path, "server")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(pair.cert_path, pair.key_path)
    to_client, to_server = os.urandom(SIZE), os.urandom(SIZE)
    server_got: list[bytes] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        server = threading.Thread(target=_server, args=(listener, server_context, to_client, server_got))
        server.start()
        context = client_ssl_context(TLSConfig(ca=ca.cert_path))
        sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
        assert isinstance(sock, SharedSSLSocket)
        share(sock)
        writer = threading.Thread(target=sock.sendall, args=(to_server,), daemon=True)
        writer.start()  # blocks until the server reads, which it does only after it sent everything
        received = bytearray()
        buf = bytearray(1 << 20)
        while len(received) < SIZE:
            n = sock.recv_into(buf)
            assert n, "the server closed early"
            received += buf[:n]
        writer.join(30)
        server.join(30)
        assert not writer.is_alive()
        assert not server.is_alive()
        sock.close()
    assert hashlib.sha256(received).digest() == hashlib.sha256(to_client).digest()
    assert hashlib.sha256(server_got[0]).digest() == hashlib.sha256(to_server).digest()
