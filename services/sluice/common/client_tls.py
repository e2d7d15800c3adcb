"""How a :class:`ClientSecurity` travels: channel credentials, SSL contexts, the token interceptors.

Used by the peer layer (``sluice.common.peers``, the only module that makes a gRPC channel) and the
wire clients (``sluice.client.wire``, ``sluice.client.shared_wire``, ``sluice.common.wire_aio``,
``sluice.broker.replica_wire``). The files a :class:`TLSConfig` names are read when a channel or
context is first made for it; a context is made once per configuration and shared.

The token travels in ``sluice.common.client_interceptors`` (gRPC calls) and in each wire hello
(``security.metadata()`` per connection).
"""

from __future__ import annotations

import functools
import os
import select
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from sluice.common.client_security import ClientSecurity, TLSConfig
from sluice.errors import InvalidArgument

__all__ = [
    "TLS_ENV",
    "TOKEN_ENV",
    "SharedSSLSocket",
    "channel_credentials",
    "channel_options",
    "client_ssl_context",
    "security_from_env",
    "server_hostname",
    "share",
    "tls_from_env",
]

#: The SDK's and the CLI's environment (``Client`` arguments win over it).
TLS_ENV = {
    "ca": "SLUICE_TLS_CA",
    "cert": "SLUICE_TLS_CERT",
    "key": "SLUICE_TLS_KEY",
    "server_name": "SLUICE_TLS_SERVER_NAME",
}
TOKEN_ENV = "SLUICE_TOKEN"


def _read(path: str | Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"TLS {what} {path}: {exc.strerror or exc}") from exc


def check_tls(tls: TLSConfig) -> None:
    if (tls.cert is None) != (tls.key is None):
        raise InvalidArgument("a TLS client certificate needs both cert and key")


def channel_credentials(tls: TLSConfig) -> grpc.ChannelCredentials:
    check_tls(tls)
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca, "CA"),
        private_key=_read(tls.key, "key"),
        certificate_chain=_read(tls.cert, "certificate"),
    )


def channel_options(tls: TLSConfig | None) -> tuple[tuple[str, Any], ...]:
    """Extra channel options: the name to verify when it is not the address's host."""
    if tls is None or not tls.server_name:
        return ()
    return (("grpc.ssl_target_name_override", tls.server_name),)


def _wait(sock: ssl.SSLSocket, event: int) -> None:
    """Until ``sock`` is ready for ``event`` (or hung up: the next operation then says how)."""
    poller = select.poll()
    poller.register(sock, event)
    poller.poll()


class SharedSSLSocket(ssl.SSLSocket):
    """A TLS socket that one reader thread and writer threads share, after :meth:`share`.

    An OpenSSL session must not be used by two threads at once, and the SDK's wire connections read
    on one thread while others write (sends are serialized by the connection's own lock). After
    ``share()`` the socket is non-blocking and every TLS operation runs under one lock that is never
    held while waiting: a read or write that would block releases it and waits for the socket with
    ``poll``, so a writer blocked by a peer that does not read never stops the reader (which the peer
    may be waiting for). Before ``share()`` (the handshake and the hello) it is a plain blocking
    ``SSLSocket``; plaintext sockets never come here.
    """

    _shared: threading.Lock | None = None

    def share(self) -> None:
        self._shared = threading.Lock()
        self.setblocking(False)

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        lock = self._shared
        if lock is None:
            return super().recv_into(buffer, nbytes, flags)
        while True:
            with lock:
                try:
                    return super().recv_into(buffer, nbytes, flags)
                except ssl.SSLWantReadError:
                    event = select.POLLIN
                except ssl.SSLWantWriteError:
                    event = select.POLLOUT
            _wait(self, event)

    def sendall(self, data: Any, flags: int = 0) -> None:
        lock = self._shared
        if lock is None:
            super().sendall(data, flags)
            return
        view = memoryview(data).cast("B")
        while view:
            sent, event = 0, select.POLLOUT
            with lock:
                try:
                    sent = super().send(view, flags)
                except ssl.SSLWantWriteError:
                    pass
                except ssl.SSLWantReadError:
                    event = select.POLLIN
            if sent:
                view = view[sent:]
            else:
                _wait(self, event)

    def pending(self) -> int:
        lock = self._shared
        if lock is None:
            return super().pending()
        with lock:
            return super().pending()


def share(sock: object) -> None:
    """Make a greeted wire socket safe for a reader and writers on other threads (TLS only)."""
    if isinstance(sock, SharedSSLSocket):
        sock.share()


@functools.lru_cache(maxsize=32)
def client_ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """The wire clients' context for ``tls`` (made once): verifies the server against ``ca`` (the
    system's roots without), TLS >= 1.2, this client's certificate when given (mTLS)."""
    check_tls(tls)
    try:
        context = ssl.create_default_context(cafile=str(tls.ca) if tls.ca is not None else None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if tls.cert is not None and tls.key is not None:
            context.load_cert_chain(str(tls.cert), str(tls.key))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgument(f"TLS client files: {exc}") from exc
    context.sslsocket_class = SharedSSLSocket  # what wrap_socket returns (asyncio uses SSLObject)
    return context


def server_hostname(tls: TLSConfig, host: str) -> str:
    return tls.server_name or host


def tls_from_env(tls: TLSConfig | None = None) -> TLSConfig | None:
    """``tls``, else the ``SLUICE_TLS_*`` environment's, else None (plaintext)."""
    if tls is None:
        values = {field: os.environ.get(env) or None for field, env in TLS_ENV.items()}
        if any(values.values()):
            tls = TLSConfig(**values)
    if tls is not None:
        check_tls(tls)
    return tls


def security_from_env(
    tls: TLSConfig | None = None, token: str | Callable[[], str] | None = None
) -> ClientSecurity:
    """A client's security from its arguments, else from ``SLUICE_TLS_*`` / ``SLUICE_TOKEN``."""
    tls = tls_from_env(tls)
    if token is None:
        token = os.environ.get(TOKEN_ENV) or None
    if isinstance(token, str):
        fixed = token
        token = lambda: fixed  # noqa: E731
    return ClientSecurity(tls=tls, token=token)
