"""A whole Sluice cluster with authentication and ACL authorization on, as real processes.

Coordinator, broker (gRPC and wire), offset store and dispatcher over a private Redis, every service
with ``--auth-mechanisms jwt,scram``, ``--authorization acl``, a cluster token and a super user. The
test signs JWTs for any principal with its own RSA key (the services trust its public key), so a
test can be anyone: :meth:`SecureCluster.token`.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.cluster import run_services
from tests.harness import RedisServer, ServiceProcess, run_redis

ISSUER = "sluice-test"
SUPER_USER = "admin"


@dataclass
class SecureCluster:
    redis: RedisServer
    coordinator: ServiceProcess
    broker: ServiceProcess
    offset_store: ServiceProcess
    dispatcher: ServiceProcess
    data_dir: Path
    key: rsa.RSAPrivateKey
    cluster_token: str
    services: list[ServiceProcess] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return self.coordinator.address

    def token(self, principal: str, ttl_s: float = 600) -> str:
        """A JWT every service accepts, naming ``principal``."""
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": "sluice", "sub": principal, "iat": now, "exp": now + int(ttl_s)}
        return jwt.encode(claims, self.key, algorithm="RS256")

    def metadata(self, principal: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token(principal)}"),)

    def admin_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata(SUPER_USER)

    def wait_for_security_version(self, version: int, timeout: float = 20.0) -> None:
        """Until every service applied the coordinator's security snapshot ``version`` (its
        ``sluice_security_version`` gauge), so ACL changes are in force everywhere."""
        deadline = time.monotonic() + timeout
        for sp in self.services:
            while _security_version(sp) < version:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{sp.service} did not reach security version {version}")
                time.sleep(0.02)


def _security_version(sp: ServiceProcess) -> int:
    with urllib.request.urlopen(f"http://{sp.metrics}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(r"^sluice_security_version (\S+)$", text, re.M)
    return int(float(m.group(1))) if m else -1


def security_args(d: Path, public_key: Path, token_file: Path) -> tuple[str, ...]:
    return (
        *("--auth-mechanisms", "jwt,scram"),
        *("--jwt-public-key-file", str(public_key), "--jwt-algorithms", "RS256"),
        *("--jwt-issuer", ISSUER, "--jwt-audience", "sluice"),
        *("--authorization", "acl", "--super-users", SUPER_USER),
        *("--cluster-token-file", str(token_file)),
    )


@contextlib.contextmanager
def run_secure_cluster() -> Iterator[SecureCluster]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with run_redis() as redis, tempfile.TemporaryDirectory(prefix="sluice-secure-") as tmp:
        d = Path(tmp)
        public_key = d / "jwt.pub.pem"
        public_key.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        cluster_token = secrets.token_urlsafe(32)
        token_file = d / "cluster.token"
        token_file.write_text(cluster_token + "\n")
        sec = security_args(d, public_key, token_file)
        with run_services(redis, d, lambda _service: sec) as svc:
            yield SecureCluster(
                redis,
                svc.coordinator,
                svc.broker,
                svc.offset_store,
                svc.dispatcher,
                d,
                key,
                cluster_token,
                svc.all,
            )
