"""Redis over TLS with an ACL user, through the services' own ``connect()`` and a ``rediss://`` URL.

A real ``redis-server`` with ``--tls-port`` (the distribution's build has TLS) and a private CA made here
with ``cryptography``; the address form is docs/security.md, "Redis".
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sluice.common.redis_client import connect
from tests.harness import free_port

PASSWORD = "tls-secret"


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(directory: Path, cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = directory / f"{cn}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, path


def _server_cert(
    directory: Path, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate
) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("redis"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = directory / "redis.crt", directory / "redis.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@dataclass
class TLSRedis:
    port: int
    ca: Path
    other_ca: Path


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSRedis]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not on PATH: install it (make deps does) to run the tests")
    directory = tmp_path_factory.mktemp("redis-tls")
    ca_key, ca_cert, ca_path = _ca(directory, "sluice-test-ca")
    _other_key, _other_cert, other_ca = _ca(directory, "other-ca")
    cert, key = _server_cert(directory, ca_key, ca_cert)
    port = free_port()
    args = [exe, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)]
    args += ["--save", "", "--appendonly", "no", "--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    args += ["--tls-ca-cert-file", str(ca_path), "--tls-auth-clients", "no"]
    args += ["--requirepass", "admin", "--user", "sluice", "on", f">{PASSWORD}", "~*", "+@all", "-@dangerous"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, f"redis-server --tls-port exited with {proc.returncode}"
            try:
                with redis.Redis(
                    host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca_path), password="admin"
                ) as r:
                    r.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server with TLS did not answer"
                time.sleep(0.05)
        yield TLSRedis(port, ca_path, other_ca)
    finally:
        proc.terminate()
        proc.wait(10)


async def _roundtrip(url: str) -> bytes | str | None:
    client = connect(url, retries=0)
    try:
        await client.set("sluice:tls", b"ok")
        return await client.get("sluice:tls")
    finally:
        await client.aclose()


def test_rediss_with_the_ca_and_an_acl_user_works(tls_redis: TLSRedis) -> None:
    url = f"rediss://sluice:{PASSWORD}@127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={tls_redis.ca}"
    assert asyncio.run(_roundtrip(url)) == b"ok"


def test_a_server_certificate_from_another_ca_is_refused(tls_redis: TLSRedis) -> None:
    url = f"rediss://sluice:{PASSWORD}@127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={tls_redis.other_ca}"
    with pytest.raises(redis.ConnectionError, match=r"(?i)certificate"):
        asyncio.run(_roundtrip(url))


def test_plaintext_to_the_tls_port_fails_cleanly_and_redis_stays_up(tls_redis: TLSRedis) -> None:
    with pytest.raises(redis.ConnectionError):
        asyncio.run(_roundtrip(f"redis://sluice:{PASSWORD}@127.0.0.1:{tls_redis.port}/0"))
    url = f"rediss://sluice:{PASSWORD}@127.0.0.1:{tls_redis.port}/0?ssl_ca_certs={tls_redis.ca}"
    assert asyncio.run(_roundtrip(url)) == b"ok"
