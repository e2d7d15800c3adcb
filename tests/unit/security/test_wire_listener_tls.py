"""A wire listener with TLS on uvloop and on asyncio, in process: mTLS per client-auth mode, the peer
certificate's principal at the hello (the integrator's seam), and a reload on the accept path."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop

from sluice.client.wire import connect, hello_bytes
from sluice.common.client_security import ClientSecurity, TLSConfig
from sluice.common.wire import PROTOCOL_VERSION
from sluice.errors import AuthenticationError
from sluice.security import certs
from sluice.security.authenticate import ServerAuthenticator
from sluice.security.cert_principal import PrincipalMapper
from sluice.security.service import ServiceSecurity
from sluice.security.session_tokens import SessionTokens
from sluice.security.tls import RELOAD_CHECK_S, ServerTLS
from sluice.server.wire import WireConnection, WireListener

RUNNERS: dict[str, Callable[[Coroutine[Any, Any, Any]], Any]] = {"uvloop": uvloop.run, "asyncio": asyncio.run}


class _Noting(WireConnection):
    principals: list[str | None] = []

    def opened(self) -> None:
        self.principals.append(PrincipalMapper().principal_from_peer_cert(self.ssl_object))


@pytest.mark.parametrize("loop", sorted(RUNNERS))
def test_mtls_and_the_peer_principal_at_the_hello(tmp_path: Path, loop: str) -> None:
    ca = certs.write_ca(tmp_path)
    server = certs.issue(ca, tmp_path, "server")
    alice = certs.issue(ca, tmp_path, "alice", client=True)
    other = certs.write_ca(tmp_path / "other")
    mallory = certs.issue(other, tmp_path / "other", "mallory", client=True)
    _Noting.principals = []
    outcomes: dict[str, object] = {}

    def dial(port: int, name: str, cert: certs.Issued | None) -> None:
        tls = TLSConfig(ca=ca.cert_path)
        if cert is not None:
            tls = TLSConfig(ca=ca.cert_path, cert=cert.cert_path, key=cert.key_path)
        hello = hello_bytes(PROTOCOL_VERSION, name, None)
        try:
            connect(("127.0.0.1", port), hello, name, 5, tls).close()
            outcomes[name] = "ok"
        except AuthenticationError:
            outcomes[name] = "refused"

    async def run(mode: str) -> None:
        tls = ServerTLS(server.cert_path, server.key_path, ca.cert_path, mode)
        listener = WireListener("test", _Noting, "127.0.0.1", 0, tls=tls)
        port = await listener.start()
        try:
            for name, cert in (("alice", alice), ("mallory", mallory), ("nobody", None)):
                await asyncio.to_thread(dial, port, f"{mode}-{name}", cert)
            await asyncio.sleep(0.1)  # the last hello's opened() has run
        finally:
            await listener.stop()

    for mode in ("require", "request"):
        RUNNERS[loop](run(mode))
    assert outcomes == {
        "require-alice": "ok",
        "require-mallory": "refused",
        "require-nobody": "refused",
        "request-alice": "ok",
        "request-mallory": "refused",  # a certificate that is sent is verified
        "request-nobody": "ok",
    }
    assert _Noting.principals == ["CN=alice", "CN=alice", None]


def test_the_accept_path_loads_a_rotated_certificate(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    first = certs.issue(ca, tmp_path, "server")
    tls = ServerTLS(first.cert_path, first.key_path)

    async def run() -> int:
        listener = WireListener("test", WireConnection, "127.0.0.1", 0, tls=tls)
        port = await listener.start()
        try:
            certs.issue(ca, tmp_path, "server")
            await asyncio.sleep(RELOAD_CHECK_S + 0.05)
            hello = hello_bytes(PROTOCOL_VERSION, "x", None)
            await asyncio.to_thread(
                lambda: connect(("127.0.0.1", port), hello, "x", 5, TLSConfig(ca=ca.cert_path)).close()
            )
            return tls.generation
        finally:
            await listener.stop()

    started = time.monotonic()
    assert uvloop.run(run()) == 1
    assert time.monotonic() - started < 10


SESSIONS = SessionTokens.from_cluster_token(b"the-cluster-token-of-this-test")


class _Recording(WireConnection):
    """A connection that remembers who its hello authenticated."""

    seen: list[str] = []

    def opened(self) -> None:
        _Recording.seen.append(self.ctx.principal.name)


def test_every_wire_connection_carries_a_fresh_token(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    pair = certs.issue(ca, tmp_path, "server")
    tokens = iter([SESSIONS.mint("first", "scram", 1, 60), SESSIONS.mint("second", "scram", 1, 60)])
    security = ClientSecurity(TLSConfig(ca=ca.cert_path), token=lambda: next(tokens))
    server_security = ServiceSecurity(
        "test", ServerAuthenticator(mechanisms=frozenset({"scram"}), sessions=SESSIONS)
    )
    _Recording.seen = []

    async def run() -> None:
        tls = ServerTLS(pair.cert_path, pair.key_path)
        listener = WireListener("test", _Recording, "127.0.0.1", 0, server_security, tls=tls)
        port = await listener.start()
        try:
            for _ in range(2):
                hello = hello_bytes(PROTOCOL_VERSION, "x", security)
                sock = await asyncio.to_thread(connect, ("127.0.0.1", port), hello, "x", 5, security.tls)
                sock.close()
        finally:
            await listener.stop()

    uvloop.run(run())
    assert _Recording.seen == ["first", "second"]
