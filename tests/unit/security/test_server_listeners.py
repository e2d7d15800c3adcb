"""A service's listeners with ``ServerTLS``, in process: the gRPC port per client-auth mode (and the
principal a verified certificate maps to), and the HTTP port's ``/healthz`` and ``/metrics`` over TLS."""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.common.client_security import ClientSecurity, TLSConfig
from sluice.common.peers import AioPeers
from sluice.security import certs
from sluice.security.cert_principal import PrincipalMapper
from sluice.security.tls import ServerTLS
from sluice.server.http import start_http

MAPPER = PrincipalMapper("RULE:^O=eng,CN=(.*)$/$1/U")


class _Principals(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Answers Check, noting the principal of each call's client certificate (None: none)."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []

    async def Check(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        self.seen.append(MAPPER.principal_from_grpc_auth_context(context.auth_context()))
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


@pytest.mark.parametrize(("mode", "principal"), [("none", None), ("request", None), ("require", "ALICE")])
def test_grpc_client_auth_modes(tmp_path: Path, mode: str, principal: str | None) -> None:
    ca = certs.write_ca(tmp_path)
    server = certs.issue(ca, tmp_path, "server")
    alice = certs.issue(ca, tmp_path, "alice", client=True, organization="eng")
    other = certs.write_ca(tmp_path / "other")
    mallory = certs.issue(other, tmp_path / "other", "mallory", client=True, organization="eng")
    servicer = _Principals()

    async def call(address: str, cert: certs.Issued | None) -> bool:
        tls = TLSConfig(ca=ca.cert_path)
        if cert is not None:
            tls = TLSConfig(ca=ca.cert_path, cert=cert.cert_path, key=cert.key_path)
        peers = AioPeers(security=ClientSecurity(tls))
        try:
            stub: Any = peers._stub(address, health_pb2_grpc.HealthStub)
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=3)
            return True
        except grpc.RpcError:
            return False
        finally:
            await peers.close()

    async def run() -> list[bool]:
        srv = aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(servicer, srv)
        tls = ServerTLS(server.cert_path, server.key_path, ca.cert_path, mode)
        address = f"127.0.0.1:{srv.add_secure_port('127.0.0.1:0', tls.grpc_credentials())}"
        await srv.start()
        try:
            return [await call(address, alice), await call(address, mallory), await call(address, None)]
        finally:
            await srv.stop(None)

    answered = asyncio.run(run())
    if mode == "require":  # only the CA's certificate gets in, and it names its principal
        assert answered == [True, False, False]
        assert servicer.seen == [principal]
    else:  # gRPC does not ask (docs/security.md): no certificate, so no principal, is ever seen
        assert answered == [True, True, True]
        assert servicer.seen == [None, None, None]


def test_metrics_and_healthz_over_tls(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    pair = certs.issue(ca, tmp_path, "svc")
    tls = ServerTLS(pair.cert_path, pair.key_path, ca.cert_path, "require")
    serving = [True]
    httpd = start_http("127.0.0.1", 0, lambda: serving[0], tls)
    try:
        url = f"https://127.0.0.1:{httpd.server_port}"
        context = ssl.create_default_context(cafile=str(ca.cert_path))  # no client certificate asked
        with urllib.request.urlopen(f"{url}/healthz", context=context, timeout=5) as answer:
            assert answer.read() == b"SERVING\n"
        with urllib.request.urlopen(f"{url}/metrics", context=context, timeout=5) as answer:
            assert b"python_info" in answer.read()
        serving[0] = False
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{url}/healthz", context=context, timeout=5)
        assert err.value.code == 503
        err.value.close()
        with pytest.raises(ConnectionError):  # plaintext HTTP on the TLS port
            urllib.request.urlopen(f"http://127.0.0.1:{httpd.server_port}/healthz", timeout=5)
        serving[0] = True
        with urllib.request.urlopen(f"{url}/healthz", context=context, timeout=5) as answer:
            assert answer.status == 200  # the port still serves
    finally:
        httpd.shutdown()
        httpd.server_close()
