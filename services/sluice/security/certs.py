"""A private CA and the certificates it issues, with ``cryptography`` (docs/security.md, "TLS").

``sluice up --tls`` and the tests use it; a production cluster takes its certificates from
cert-manager or its own PKI instead. Keys are ECDSA P-256 (small, fast handshakes); validity is
short by default, because Sluice relies on short-lived certificates rather than revocation lists.
Private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CA", "Issued", "issue", "load_ca", "write_ca"]

#: The default lifetime of an issued certificate (``sluice up --tls`` re-issues at every start).
DEFAULT_DAYS = 30
CA_DAYS = 365


@dataclass(frozen=True)
class CA:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_path: Path


@dataclass(frozen=True)
class Issued:
    """An issued certificate: its files and serial number."""

    cert_path: Path
    key_path: Path
    serial: int


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    # Written beside, then renamed: a service reloading on the mtime never reads half a key.
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tmp.replace(path)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def write_ca(directory: str | Path, name: str = "Sluice private CA", days: int = CA_DAYS) -> CA:
    """A new CA in ``directory``: ``ca.crt`` and ``ca.key`` (0600)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(directory / "ca.key", key)
    _write_cert(directory / "ca.crt", cert)
    return CA(cert, key, directory / "ca.crt")


def load_ca(directory: str | Path) -> CA:
    """The CA ``write_ca`` left in ``directory``."""
    directory = Path(directory)
    cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / 'ca.key'}: not an ECDSA key")
    return CA(cert, key, directory / "ca.crt")


def _san(names: Iterable[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):  # once each, in order
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def issue(
    ca: CA,
    directory: str | Path,
    name: str,
    sans: Iterable[str] = (),
    *,
    client: bool = False,
    days: float = DEFAULT_DAYS,
    organization: str | None = None,
) -> Issued:
    """Issue ``<directory>/<name>.crt`` and ``<name>.key`` signed by ``ca``.

    The subject is ``CN=<name>`` (``O=<organization>`` too when given). A server certificate
    (``client=False``) names ``127.0.0.1``, ``localhost`` and ``sans`` and may also authenticate as
    a client (the services use it for mTLS towards each other); a client certificate names only
    ``sans``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    now = _now()
    serial = x509.random_serial_number()
    usages = (
        [ExtendedKeyUsageOID.CLIENT_AUTH]
        if client
        else [
            ExtendedKeyUsageOID.SERVER_AUTH,
            ExtendedKeyUsageOID.CLIENT_AUTH,
        ]
    )
    all_sans = list(sans) if client else ["127.0.0.1", "localhost", *sans]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attributes))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if all_sans:
        builder = builder.add_extension(_san(all_sans), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.crt"
    # The key first: a reader that sees the new certificate's mtime then finds its key.
    _write_key(key_path, key)
    _write_cert(cert_path, cert)
    return Issued(cert_path, key_path, serial)
