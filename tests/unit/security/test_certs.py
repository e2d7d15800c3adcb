"""The private CA (``sluice.security.certs``): what it issues verifies, names what it was asked to, and
keeps its keys private."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import stat
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sluice.security import certs
from tests.unit.security.handshake import handshake


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_a_server_certificate_names_loopback_and_the_given_names(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    issued = certs.issue(ca, tmp_path, "broker", ["broker-0.sluice.svc", "10.1.2.3"], days=2)
    cert = _load(issued.cert_path)
    assert cert.serial_number == issued.serial
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "broker"
    assert cert.issuer == ca.cert.subject
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost", "broker-0.sluice.svc"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.1.2.3"),
    ]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert datetime.timedelta(days=2) <= lifetime <= datetime.timedelta(days=2, minutes=6)


def test_a_client_certificate_is_for_clients_only(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    cert = _load(certs.issue(ca, tmp_path, "alice", client=True, organization="eng").cert_path)
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.subject.rfc4514_string() == "O=eng,CN=alice"


def test_keys_are_private_and_a_reissue_has_a_new_serial(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    first = certs.issue(ca, tmp_path, "svc")
    second = certs.issue(certs.load_ca(tmp_path), tmp_path, "svc")
    assert first.serial != second.serial
    assert _load(second.cert_path).serial_number == second.serial
    for key in (tmp_path / "ca.key", second.key_path):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600


def test_openssl_verifies_the_chain_and_loads_the_pair(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    issued = certs.issue(ca, tmp_path, "svc")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(issued.cert_path, issued.key_path)  # the key matches the certificate
    client = ssl.create_default_context(cafile=str(ca.cert_path))
    c, _ = handshake(server, client)
    peer = c.getpeercert()
    assert peer is not None
    assert peer["subject"] == ((("commonName", "svc"),),)
