"""``sluice.security.tls.ServerTLS``: certificates re-read from their files, for gRPC and the wire."""

from __future__ import annotations

import ssl
import time
from pathlib import Path

import pytest
from cryptography import x509

from sluice.errors import InvalidArgument
from sluice.security import certs
from sluice.security.settings import SecuritySettings
from sluice.security.tls import RELOAD_CHECK_S, ServerTLS, server_tls
from tests.unit.security.handshake import handshake


def _served_serial(context: ssl.SSLContext, ca: Path) -> int:
    """The serial of the certificate ``context`` presents in a handshake (in memory)."""
    client = ssl.create_default_context(cafile=str(ca))
    c, _ = handshake(context, client)
    der = c.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _past_the_check() -> None:
    time.sleep(RELOAD_CHECK_S + 0.05)


def test_a_rotated_certificate_is_served_by_the_wire_context_and_given_to_grpc(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    first = certs.issue(ca, tmp_path, "svc")
    tls = ServerTLS(first.cert_path, first.key_path)
    context = tls.ssl_context()
    assert _served_serial(context, ca.cert_path) == first.serial
    assert tls._fetch_grpc_config() is None  # nothing changed: gRPC keeps what it has
    second = certs.issue(ca, tmp_path, "svc")
    _past_the_check()
    assert tls.maybe_reload()  # the wire listener found it first
    assert tls.generation == 1
    assert _served_serial(context, ca.cert_path) == second.serial  # the same context, a new chain
    assert tls._fetch_grpc_config() is not None  # gRPC is still handed the change once
    assert tls._fetch_grpc_config() is None


def test_the_files_are_checked_at_most_once_a_second(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    first = certs.issue(ca, tmp_path, "svc")
    tls = ServerTLS(first.cert_path, first.key_path)
    _past_the_check()
    assert not tls.maybe_reload()  # looked: no change
    certs.issue(ca, tmp_path, "svc")
    assert not tls.maybe_reload()  # within the second: not looked at
    _past_the_check()
    assert tls.maybe_reload()


def test_a_half_written_rotation_keeps_the_old_pair(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    first = certs.issue(ca, tmp_path, "svc")
    tls = ServerTLS(first.cert_path, first.key_path)
    context = tls.ssl_context()
    other = certs.issue(ca, tmp_path / "other", "svc")
    first.key_path.write_bytes(other.key_path.read_bytes())  # the new key, the old certificate
    _past_the_check()
    assert not tls.maybe_reload()
    assert tls.generation == 0
    assert _served_serial(context, ca.cert_path) == first.serial
    first.cert_path.write_bytes(other.cert_path.read_bytes())  # the rotation completes
    _past_the_check()
    assert tls.maybe_reload()
    assert _served_serial(context, ca.cert_path) == other.serial


def test_client_auth_modes_set_the_wire_verify_mode(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    pair = certs.issue(ca, tmp_path, "svc")
    modes = {"none": ssl.CERT_NONE, "request": ssl.CERT_OPTIONAL, "require": ssl.CERT_REQUIRED}
    for mode, verify in modes.items():
        tls = ServerTLS(pair.cert_path, pair.key_path, ca.cert_path, mode)
        assert tls.ssl_context().verify_mode == verify
        assert tls.ssl_context().minimum_version == ssl.TLSVersion.TLSv1_2
        assert tls.ssl_context("none").verify_mode == ssl.CERT_NONE  # the metrics port's


def test_bad_settings_are_typed_errors(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    pair = certs.issue(ca, tmp_path, "svc")
    assert server_tls(SecuritySettings()) is None
    with pytest.raises(InvalidArgument, match="without tls_key"):
        server_tls(SecuritySettings(tls_cert=pair.cert_path))
    with pytest.raises(InvalidArgument, match="needs tls_ca"):
        server_tls(
            SecuritySettings(tls_cert=pair.cert_path, tls_key=pair.key_path, tls_client_auth="require")
        )
    with pytest.raises(InvalidArgument, match="tls_client_auth"):
        ServerTLS(pair.cert_path, pair.key_path, ca.cert_path, "sometimes")
    with pytest.raises(InvalidArgument, match="TLS files"):
        ServerTLS(tmp_path / "missing.crt", pair.key_path)
