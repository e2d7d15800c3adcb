"""JWT verification against a JWKS served by a real HTTP server (http.server on 127.0.0.1), as the
Kubernetes API server serves /openid/v1/jwks: ServiceAccount tokens, key rotation, the unknown-kid
flood (counted in the server's requests), forged tokens, and the fetcher's limits."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ipaddress
import logging
import secrets
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sluice.errors import AuthenticationError
from sluice.security.jwks import JwksCache, JwksFetcher
from sluice.security.jwt_auth import JwtVerifier, VerifiedToken
from sluice.security.jwt_keys import parse_algorithms
from sluice.security.settings import SecuritySettings
from tests.jwt_tokens import (
    AUDIENCE,
    ISSUER,
    claims,
    ec_key,
    hmac_signed,
    jwk,
    jwks,
    public_pem,
    rsa_key,
    sign,
    tampered,
    unsigned,
)

JWKS_PATH = "/openid/v1/jwks"


@dataclass
class _JwksServer:
    document: bytes
    requests: list[str] = field(default_factory=list)
    authorization: list[str | None] = field(default_factory=list)
    redirect: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def fetches(self) -> int:
        with self.lock:
            return self.requests.count(JWKS_PATH)


@contextlib.contextmanager
def _serving(tls: ssl.SSLContext | None = None) -> Iterator[_JwksServer]:
    """A JWKS server on 127.0.0.1 (a free port), over TLS with ``tls``."""
    state = _JwksServer(jwks(jwk(rsa_key(), "k1")))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with state.lock:
                state.requests.append(self.path)
                state.authorization.append(self.headers.get("Authorization"))
                body, redirect = state.document, state.redirect
            if redirect and self.path == JWKS_PATH:
                self.send_response(302)
                self.send_header("Location", "/elsewhere")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
    scheme = "http" if tls is None else "https"
    state.url = f"{scheme}://127.0.0.1:{httpd.server_address[1]}{JWKS_PATH}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def server() -> Iterator[_JwksServer]:
    with _serving() as state:
        yield state


def _tls_files(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    """A private CA (its certificate written to ca.crt) and a server context with a certificate it
    signed for 127.0.0.1: what the API server and the pod's ServiceAccount ca.crt are in a cluster."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test cluster CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return ca_file, context


def _verifier(server: _JwksServer, now: list[float], **kwargs: object) -> JwtVerifier:
    """A verifier on the server's JWKS whose rate limit runs on ``now`` (monotonic seconds)."""
    cache = JwksCache(
        JwksFetcher(server.url, timeout=5.0).fetch, refetch_interval=10.0, max_age=600.0, clock=lambda: now[0]
    )
    options: dict[str, object] = {"issuer": ISSUER, "audience": AUDIENCE} | kwargs
    return JwtVerifier(algorithms=parse_algorithms("RS256,ES256"), jwks=cache, **options)  # type: ignore[arg-type]


def _run(verifier: JwtVerifier, token: str) -> VerifiedToken:
    return asyncio.run(verifier.verify(token))


def _refused(verifier: JwtVerifier, token: str, words: str) -> None:
    with pytest.raises(AuthenticationError, match=words) as info:
        _run(verifier, token)
    assert token not in str(info.value)


def test_a_kubernetes_serviceaccount_token_authenticates(server: _JwksServer, tmp_path: Path) -> None:
    """The in-cluster setup (docs/security.md) with the settings a pod would use, on a test server."""
    sa_token = tmp_path / "token"
    sa_token.write_text("the-pods-own-sa-token\n")
    settings = SecuritySettings(
        auth_mechanisms="jwt",
        jwt_jwks_url=server.url,
        jwt_jwks_token_file=sa_token,
        jwt_issuer=ISSUER,
        jwt_audience=AUDIENCE,
    )
    verifier = JwtVerifier.from_settings(settings)
    token = sign(claims(sub="system:serviceaccount:analytics:spark-driver"), rsa_key(), kid="k1")
    verified = _run(verifier, token)
    assert verified.principal == "system:serviceaccount:analytics:spark-driver"
    assert verified.to_principal().mechanism == "jwt"
    assert verified.kubernetes is not None
    assert verified.kubernetes.pod == "job-exec-1"
    assert server.authorization == ["Bearer the-pods-own-sa-token"]
    assert _run(verifier, token) is verified
    assert server.fetches() == 1


def test_an_ec_key_in_the_jwks_verifies_es256(server: _JwksServer) -> None:
    server.document = jwks(jwk(rsa_key(), "k1"), jwk(ec_key(), "e1"))
    verifier = _verifier(server, [0.0])
    assert _run(verifier, sign(claims(), ec_key(), kid="e1")).key_id == "e1"


def test_forged_tokens_are_refused(server: _JwksServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    verifier = _verifier(server, [0.0])
    _refused(verifier, unsigned(claims()), "algorithm 'none' is not accepted")
    assert server.fetches() == 0  # refused on the header: no key was looked up
    public = public_pem(rsa_key())
    _refused(verifier, hmac_signed(claims(), public), "algorithm 'HS256' is not accepted")
    _refused(verifier, hmac_signed(claims(), server.document), "algorithm 'HS256' is not accepted")
    _refused(verifier, tampered(sign(claims(), rsa_key()), sub="system:masters"), "signature does not verify")
    # Signed by a key the JWKS does not hold: under a kid it does hold, and under one it does not.
    _refused(verifier, sign(claims(), rsa_key("intruder"), kid="k1"), "signature does not verify")
    _refused(verifier, sign(claims(), rsa_key("intruder"), kid="intruder"), "no key with kid 'intruder'")
    _refused(verifier, sign(claims(aud=["other"]), rsa_key()), "audience")
    _refused(verifier, sign(claims(iss="https://other.example"), rsa_key()), "issuer")
    _refused(verifier, sign(claims(exp=1_000_000), rsa_key()), "expired")
    _refused(verifier, sign(claims(exp=None), rsa_key()), "no exp claim")
    assert "eyJ" not in caplog.text  # no token (every one starts so) in any log line


def test_a_flood_of_unknown_kids_is_not_a_flood_of_fetches(server: _JwksServer) -> None:
    now = [0.0]
    verifier = _verifier(server, now)
    intruder = rsa_key("intruder")
    flood = [sign(claims(), intruder, kid=secrets.token_hex(8)) for _ in range(500)]

    async def all_refused(tokens: list[str]) -> int:
        results = await asyncio.gather(*(verifier.verify(t) for t in tokens), return_exceptions=True)
        return sum(isinstance(r, AuthenticationError) for r in results)

    assert asyncio.run(all_refused(flood)) == 500  # concurrently: one shared fetch
    assert server.fetches() == 1
    now[0] = 5.0
    assert asyncio.run(all_refused(flood[:250])) == 250  # one after another within the interval
    assert server.fetches() == 1
    now[0] = 10.5
    assert asyncio.run(all_refused(flood)) == 500
    assert server.fetches() == 2  # one refetch per refetch_interval, whatever the number of kids


def test_a_rotated_key_is_picked_up_on_the_rate_limited_refetch(server: _JwksServer) -> None:
    now = [0.0]
    verifier = _verifier(server, now)
    old_token = sign(claims(), rsa_key(), kid="k1")
    assert _run(verifier, old_token).key_id == "k1"
    server.document = jwks(jwk(rsa_key(), "k1"), jwk(rsa_key("next"), "k2"))  # the issuer adds a key
    new_token = sign(claims(), rsa_key("next"), kid="k2")
    now[0] = 3.0
    _refused(verifier, new_token, "no key with kid 'k2'")  # within the interval: not fetched yet
    assert server.fetches() == 1
    now[0] = 10.5
    assert _run(verifier, new_token).key_id == "k2"
    assert server.fetches() == 2
    # The old key is retired: once a refetch sees it gone, what it verified is verified again.
    server.document = jwks(jwk(rsa_key("next"), "k2"))
    now[0] = 21.0
    _refused(verifier, sign(claims(), rsa_key("next"), kid="k3"), "no key with kid 'k3'")
    assert server.fetches() == 3
    _refused(verifier, old_token, "no key with kid 'k1'")


def test_a_principal_claim_other_than_sub(server: _JwksServer) -> None:
    verifier = _verifier(server, [0.0], principal_claim="email")
    token = sign(claims(iss=ISSUER, sub="2f9e-idp-uuid", email="alice@example.com"), rsa_key())
    assert _run(verifier, token).principal == "alice@example.com"


def test_the_fetcher_refuses_oversized_documents_and_redirects(server: _JwksServer) -> None:
    too_big = JwksFetcher(server.url, max_bytes=100)
    with pytest.raises(ValueError, match="larger than 100 bytes"):
        too_big.fetch()
    server.redirect = True
    verifier = _verifier(server, [0.0])
    _refused(verifier, sign(claims(), rsa_key()), "JWKS unavailable: HTTP Error 302")
    assert "/elsewhere" not in server.requests  # not followed: the bearer token stays with the JWKS URL


def test_the_jwks_over_https_with_the_clusters_ca_and_a_bearer_token(tmp_path: Path) -> None:
    """The in-cluster fetch: https, the ServiceAccount's ca.crt, its token; and without the CA bundle
    the server's certificate is not trusted, so no key is fetched and no token accepted."""
    ca_file, tls = _tls_files(tmp_path)
    sa_token = tmp_path / "token"
    sa_token.write_text("sa-token-1")
    with _serving(tls) as state:
        settings = SecuritySettings(
            auth_mechanisms="jwt",
            jwt_jwks_url=state.url,
            jwt_jwks_ca_file=ca_file,
            jwt_jwks_token_file=sa_token,
            jwt_issuer=ISSUER,
        )
        token = sign(claims(), rsa_key(), kid="k1")
        assert (
            _run(JwtVerifier.from_settings(settings), token).principal
            == "system:serviceaccount:spark:executor"
        )
        assert state.authorization == ["Bearer sa-token-1"]
        untrusting = JwtVerifier.from_settings(replace(settings, jwt_jwks_ca_file=None))
        _refused(untrusting, token, "JWKS unavailable: .*CERTIFICATE_VERIFY_FAILED")
        assert state.fetches() == 1  # the handshake failed: the request (and the token) never went
