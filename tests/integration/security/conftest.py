"""A whole cluster with TLS on every port, for the TLS tests: redis, coordinator, broker (gRPC and
wire), offset store and dispatcher, each with its own certificate from a private CA made here
(``sluice.security.certs``); the services call each other over TLS (and with their certificates, so
``--tls-client-auth require`` holds between them too)."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sluice import Client, TLSConfig
from sluice.security import certs
from tests.cluster import run_services
from tests.harness import RedisServer, ServiceProcess, run_redis


@dataclass
class TLSCluster:
    redis: RedisServer
    coordinator: ServiceProcess
    broker: ServiceProcess
    offset_store: ServiceProcess
    dispatcher: ServiceProcess
    pki: Path
    ca: certs.CA

    @property
    def bootstrap(self) -> str:
        return self.coordinator.address

    def tls(self, client_cert: bool = False) -> TLSConfig:
        if not client_cert:
            return TLSConfig(ca=self.ca.cert_path)
        issued = certs.issue(self.ca, self.pki / "clients", "alice", client=True)
        return TLSConfig(ca=self.ca.cert_path, cert=issued.cert_path, key=issued.key_path)

    def client(self, **kwargs: object) -> Client:
        kwargs.setdefault("tls", self.tls(client_cert=True))
        return Client(self.bootstrap, request_timeout=10, **kwargs)  # type: ignore[arg-type]

    def wire(self, service: ServiceProcess) -> tuple[str, int]:
        """A service's wire address from its ready line (``wire=host:port``)."""
        for line in service.output:
            if "SLUICE_READY" in line and " wire=" in line:
                host, port = line.rsplit(" wire=", 1)[1].strip().rsplit(":", 1)
                return host, int(port)
        raise AssertionError(f"{service.service} has no wire port")


def _wait_until_ready(bootstrap: str, tls: TLSConfig, timeout: float = 30.0) -> None:
    """Setup only: the broker and the dispatcher registered and alive."""
    deadline = time.monotonic() + timeout
    with Client(bootstrap, request_timeout=5, tls=tls) as c:
        while True:
            md = c.metadata(refresh=True)
            if any(b.alive for b in md.brokers.values()) and any(d.alive for d in md.dispatchers.values()):
                return
            assert time.monotonic() < deadline, f"the cluster did not come up: {md}"
            time.sleep(0.1)


@contextlib.contextmanager
def run_tls_cluster(client_auth: str = "none") -> Iterator[TLSCluster]:
    with run_redis() as redis, tempfile.TemporaryDirectory(prefix="sluice-tls-") as d:
        pki = Path(d) / "pki"
        ca = certs.write_ca(pki)

        def tls_args(name: str) -> tuple[str, ...]:
            issued = certs.issue(ca, pki, name)
            return (
                *("--tls-cert", str(issued.cert_path), "--tls-key", str(issued.key_path)),
                *("--tls-ca", str(ca.cert_path), "--tls-client-auth", client_auth),
            )

        with run_services(redis, Path(d), tls_args) as svc:
            cluster = TLSCluster(
                redis, svc.coordinator, svc.broker, svc.offset_store, svc.dispatcher, pki, ca
            )
            _wait_until_ready(svc.coordinator.address, cluster.tls(client_cert=True))
            yield cluster
