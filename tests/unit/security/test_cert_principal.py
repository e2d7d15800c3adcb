"""Kafka's ``ssl.principal.mapping.rules`` (``sluice.security.cert_principal``)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from sluice.errors import InvalidArgument
from sluice.security import certs
from sluice.security.cert_principal import PrincipalMapper, certificate_name
from tests.unit.security.handshake import handshake

DN = "CN=Alice,OU=ServiceUsers,O=Corp,C=US"


def test_default_is_the_whole_dn() -> None:
    assert PrincipalMapper("DEFAULT").map_name(DN) == DN
    assert PrincipalMapper("").map_name(DN) == DN


def test_a_rule_rewrites_with_java_group_references() -> None:
    mapper = PrincipalMapper(r"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/")
    assert mapper.map_name(DN) == "Alice"


@pytest.mark.parametrize(("flag", "expected"), [("L", "alice"), ("U", "ALICE"), ("", "Alice")])
def test_case_flags(flag: str, expected: str) -> None:
    assert PrincipalMapper(rf"RULE:^CN=(.*?),.*$/$1/{flag}").map_name(DN) == expected


def test_no_match_falls_through_to_the_next_rule_then_to_none() -> None:
    mapper = PrincipalMapper(r"RULE:^CN=(.*?),OU=Admins.*$/admin-$1/L, RULE:^O=(.*)$/org-$1/")
    assert mapper.map_name(DN) is None  # neither matches the whole name
    assert mapper.map_name("CN=Bob,OU=Admins,O=Corp") == "admin-bob"
    assert mapper.map_name("O=Corp") == "org-Corp"
    with_default = PrincipalMapper(r"RULE:^CN=(.*?),OU=Admins.*$/$1/,DEFAULT")
    assert with_default.map_name(DN) == DN


def test_a_rule_must_match_the_whole_name() -> None:
    assert PrincipalMapper(r"RULE:CN=(\w+)/$1/").map_name(DN) is None
    assert PrincipalMapper(r"RULE:CN=(\w+).*/$1/").map_name(DN) == "Alice"


def test_escaped_slashes_and_two_groups() -> None:
    mapper = PrincipalMapper(r"RULE:^CN=([^,]+),OU=([^,]+).*$/$2\/$1/L")
    assert mapper.map_name(DN) == "serviceusers/alice"


@pytest.mark.parametrize("rules", ["RULE:^CN=(.*$/$1/", "RULE:nope", "SOMETHING", "RULE:a/b/X"])
def test_bad_rules_are_a_typed_error(rules: str) -> None:
    with pytest.raises(InvalidArgument):
        PrincipalMapper(rules)


def _pem(path: Path) -> bytes:
    return path.read_bytes()


def test_from_a_grpc_auth_context(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    issued = certs.issue(ca, tmp_path, "alice", client=True, organization="eng")
    mapper = PrincipalMapper(r"RULE:^O=eng,CN=(.*)$/user-$1/")
    context = {"x509_pem_cert": [_pem(issued.cert_path)], "transport_security_type": [b"ssl"]}
    assert mapper.principal_from_grpc_auth_context(context) == "user-alice"
    assert mapper.principal_from_grpc_auth_context(context) == "user-alice"  # from the cache
    assert mapper.principal_from_grpc_auth_context({"transport_security_type": [b"ssl"]}) is None
    assert mapper.principal_from_grpc_auth_context({"x509_pem_cert": [b"not a pem"]}) is None


def test_the_first_san_names_a_certificate_without_a_cn(tmp_path: Path) -> None:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    ca = certs.write_ca(tmp_path)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    spiffe = "spiffe://cluster.local/ns/spark/sa/executor"
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("executor.spark"), x509.UniformResourceIdentifier(spiffe)]
            ),
            critical=True,
        )
        .sign(ca.key, hashes.SHA256())
    )
    assert certificate_name(cert) == spiffe
    # A slash inside a pattern is escaped, as in Kafka.
    rule = r"RULE:^spiffe:\/\/[^\/]+\/ns\/([^\/]+)\/sa\/(.*)$/$1:$2/"
    assert PrincipalMapper(rule).map_certificate(cert) == "spark:executor"


def test_from_a_peer_certificate_over_tls(tmp_path: Path) -> None:
    ca = certs.write_ca(tmp_path)
    server_cert = certs.issue(ca, tmp_path, "server")
    client_cert = certs.issue(ca, tmp_path, "bob", client=True)
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(server_cert.cert_path, server_cert.key_path)
    server.load_verify_locations(cafile=str(ca.cert_path))
    server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(cafile=str(ca.cert_path))
    client.load_cert_chain(client_cert.cert_path, client_cert.key_path)
    _, s = handshake(server, client)
    assert PrincipalMapper().principal_from_peer_cert(s) == "CN=bob"
    assert PrincipalMapper().principal_from_peer_cert(None) is None
