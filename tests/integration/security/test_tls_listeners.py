"""TLS on every listener (issue 15, "Must show: TLS"), against real processes.

- a plaintext client on a TLS gRPC port and on a TLS wire port fails cleanly, with a typed error, and the
  services go on serving TLS clients;
- probes: ``/healthz`` on the metrics port answers while gRPC is TLS-only;
- a certificate re-issued on disk (a new serial) is what new connections get, on gRPC and on the wire,
  with no restart.
"""

from __future__ import annotations

import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from sluice import Client
from sluice.client.wire import connect, hello_bytes
from sluice.common.wire import PROTOCOL_VERSION
from sluice.errors import SluiceError
from sluice.security import certs
from tests.harness import ServiceProcess
from tests.integration.security.conftest import TLSCluster, run_tls_cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster() -> Iterator[TLSCluster]:
    with run_tls_cluster("none") as c:
        yield c


def _round_trip(cluster: TLSCluster, topic: str) -> None:
    """Create, produce one record and fetch it back over TLS."""
    with Client(cluster.bootstrap, request_timeout=10, tls=cluster.tls()) as client:
        client.admin.create_topic(topic, partitions=1)
        with client.producer(topic) as producer:
            offset = producer.send(b"over tls").result(10).offset
        records = client.fetcher({(topic, 0): offset}).fetch(timeout=10)
        assert [r.value for r in records] == [b"over tls"]


def _healthz(service: ServiceProcess) -> int:
    with urllib.request.urlopen(f"http://{service.metrics}/healthz", timeout=5) as answer:
        return int(answer.status)


def test_a_plaintext_grpc_client_is_refused_cleanly(cluster: TLSCluster) -> None:
    started = time.monotonic()
    with Client(cluster.bootstrap, request_timeout=2) as plain, pytest.raises(SluiceError):
        plain.metadata(refresh=True)
    assert time.monotonic() - started < 30
    _round_trip(cluster, "tls-after-plain-grpc")


@pytest.mark.parametrize("service", ["broker", "dispatcher"])
def test_a_plaintext_wire_client_is_refused_cleanly(cluster: TLSCluster, service: str) -> None:
    sp = cluster.broker if service == "broker" else cluster.dispatcher
    hello = hello_bytes(PROTOCOL_VERSION, "plaintext", None)
    for _ in range(3):  # again and again: the listener stays up
        with pytest.raises(SluiceError):
            connect(cluster.wire(sp), hello, f"{service} wire", timeout=5).close()
    _round_trip(cluster, f"tls-after-plain-wire-{service}")
    assert _healthz(sp) == 200


def test_probes_use_healthz_on_the_metrics_port(cluster: TLSCluster) -> None:
    for sp in (cluster.coordinator, cluster.broker, cluster.offset_store, cluster.dispatcher):
        assert _healthz(sp) == 200
    with urllib.request.urlopen(f"http://{cluster.broker.metrics}/metrics", timeout=5) as answer:
        assert b"sluice_" in answer.read()


def _served_serial(address: tuple[str, int], ca: Path) -> int:
    """The serial of the certificate a TLS port presents to a new connection."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])  # what a gRPC client offers
    with (
        socket.create_connection(address, timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as sock,
    ):
        der = sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _split(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def test_a_rotated_certificate_is_served_without_a_restart(cluster: TLSCluster) -> None:
    grpc_port, wire_port = _split(cluster.broker.address), cluster.wire(cluster.broker)
    before = _served_serial(grpc_port, cluster.ca.cert_path)
    assert _served_serial(wire_port, cluster.ca.cert_path) == before
    pid = cluster.broker.process.pid
    rotated = certs.issue(cluster.ca, cluster.pki, "broker")  # same files, a new serial
    assert rotated.serial != before
    deadline = time.monotonic() + 15
    served = {"grpc": before, "wire": before}
    while served != {"grpc": rotated.serial, "wire": rotated.serial}:
        assert time.monotonic() < deadline, f"still served after the rotation: {served}"
        time.sleep(0.3)
        served = {
            "grpc": _served_serial(grpc_port, cluster.ca.cert_path),
            "wire": _served_serial(wire_port, cluster.ca.cert_path),
        }
    assert cluster.broker.process.pid == pid
    assert cluster.broker.process.poll() is None
    _round_trip(cluster, "tls-after-rotation")
