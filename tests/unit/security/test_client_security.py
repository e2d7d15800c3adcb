"""The client side (``sluice.common.client_tls`` through the peer layer): TLS channels, the token on
every call kind, and the environment the SDK reads."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.common.client_security import ClientSecurity, TLSConfig
from sluice.common.client_tls import security_from_env
from sluice.common.peers import AioPeers, Peers
from sluice.errors import InvalidArgument
from sluice.security import certs
from sluice.security.settings import SecuritySettings
from sluice.security.setup import service_security


class _Recorder(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Answers Check and Watch, remembering each call's metadata."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def Check(self, request: Any, context: grpc.ServicerContext) -> health_pb2.HealthCheckResponse:
        self.seen.append(dict(context.invocation_metadata()))  # type: ignore[arg-type]
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    def Watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[health_pb2.HealthCheckResponse]:
        self.seen.append(dict(context.invocation_metadata()))  # type: ignore[arg-type]
        yield health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture
def pki(tmp_path: Path) -> tuple[certs.CA, certs.Issued]:
    ca = certs.write_ca(tmp_path)
    return ca, certs.issue(ca, tmp_path, "server")


@pytest.fixture
def server(pki: tuple[certs.CA, certs.Issued]) -> Iterator[tuple[str, _Recorder]]:
    _, pair = pki
    recorder = _Recorder()
    srv = grpc.server(futures.ThreadPoolExecutor(4))
    health_pb2_grpc.add_HealthServicer_to_server(recorder, srv)
    creds = grpc.ssl_server_credentials([(pair.key_path.read_bytes(), pair.cert_path.read_bytes())])
    port = srv.add_secure_port("127.0.0.1:0", creds)
    srv.start()
    try:
        yield f"127.0.0.1:{port}", recorder
    finally:
        srv.stop(None)


def test_tls_and_a_fresh_token_on_unary_and_streaming_calls(
    pki: tuple[certs.CA, certs.Issued], server: tuple[str, _Recorder]
) -> None:
    ca, _ = pki
    address, recorder = server
    tokens = iter(["t1", "t2", "t3"])
    peers = Peers(security=ClientSecurity(TLSConfig(ca=ca.cert_path), token=lambda: next(tokens)))
    try:
        stub = peers.stub(address, health_pb2_grpc.HealthStub)
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == 1
        assert next(iter(stub.Watch(health_pb2.HealthCheckRequest(), timeout=5))).status == 1
    finally:
        peers.close()
    assert [seen["authorization"] for seen in recorder.seen] == ["Bearer t1", "Bearer t2"]


def test_no_token_no_metadata_and_aio_calls_carry_it(
    pki: tuple[certs.CA, certs.Issued], server: tuple[str, _Recorder]
) -> None:
    ca, _ = pki
    address, recorder = server
    tls = TLSConfig(ca=ca.cert_path, server_name="localhost")  # verified as localhost, dialled by IP

    async def calls() -> None:
        for security in (ClientSecurity(tls), ClientSecurity(tls, token=lambda: "aio")):
            peers = AioPeers(security=security)
            try:
                stub: Any = peers._stub(address, health_pb2_grpc.HealthStub)
                await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                async for _ in stub.Watch(health_pb2.HealthCheckRequest(), timeout=5):
                    break
            finally:
                await peers.close()

    asyncio.run(calls())
    assert ["authorization" in seen for seen in recorder.seen] == [False, False, True, True]
    assert recorder.seen[-1]["authorization"] == "Bearer aio"


def test_a_certificate_from_another_ca_or_name_is_refused(
    tmp_path: Path, server: tuple[str, _Recorder]
) -> None:
    address, recorder = server
    other = certs.write_ca(tmp_path / "other")
    for tls in (TLSConfig(ca=other.cert_path), TLSConfig(ca=tmp_path / "ca.crt", server_name="elsewhere")):
        peers = Peers(security=ClientSecurity(tls))
        try:
            with pytest.raises(grpc.RpcError) as err:
                peers.stub(address, health_pb2_grpc.HealthStub).Check(
                    health_pb2.HealthCheckRequest(), timeout=3
                )
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            peers.close()
    assert recorder.seen == []


def test_the_environment_fills_what_the_arguments_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_TLS_CA", "/etc/ca.pem")
    monkeypatch.setenv("SLUICE_TLS_SERVER_NAME", "sluice.internal")
    monkeypatch.setenv("SLUICE_TOKEN", "from-env")
    security = security_from_env()
    assert security.tls == TLSConfig(ca="/etc/ca.pem", server_name="sluice.internal")
    assert security.metadata() == (("authorization", "Bearer from-env"),)
    given = security_from_env(TLSConfig(ca="/mine.pem"), token=lambda: "mine")
    assert given.tls == TLSConfig(ca="/mine.pem")
    assert given.metadata() == (("authorization", "Bearer mine"),)
    with pytest.raises(InvalidArgument, match="both cert and key"):
        security_from_env(TLSConfig(cert="/c.pem"))


def test_a_service_calls_with_its_certificate_and_the_cluster_token(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-cluster-token-of-a-test\n")
    cert, key, ca = tmp_path / "c.crt", tmp_path / "c.key", tmp_path / "ca.crt"
    settings = SecuritySettings(tls_cert=cert, tls_key=key, tls_ca=ca, cluster_token_file=token)
    security = service_security(settings)
    assert security.tls == TLSConfig(ca=ca, cert=cert, key=key)
    assert security.metadata() == (("authorization", "Bearer s3cret-cluster-token-of-a-test"),)
    assert service_security(SecuritySettings()) == ClientSecurity()
    token.write_text("")
    with pytest.raises(InvalidArgument, match="shorter than 16 bytes"):
        service_security(SecuritySettings(cluster_token_file=token))
