"""``sluice up --auth``: authentication and ACLs on every service, and a super user ``admin``.

In the data dir, kept across restarts:

- ``cluster.token`` (mode 0600): 32 random bytes, base64. Every service gets it as
  ``--cluster-token-file``: they present it to each other (the cluster principal, which may call the
  internal RPCs) and it keys the session tokens, so any service verifies a session any coordinator
  issued.
- ``admin.password`` (mode 0600): the password of the SCRAM user ``admin``, the one super user.
  Reused when it exists, so a script that read it once keeps working.

Every service runs with ``--auth-mechanisms scram --authorization acl --super-users admin``: SCRAM is
the one mechanism a person can use with nothing but the password file. With ``--tls`` too, client
certificates are not turned into principals (no ``mtls``): the local CA issues every service's
certificate and a client certificate, and ``mtls`` would make whoever holds ``client.key`` a principal
with no ACL of its own, which only adds a way in. Production sets its mechanisms itself (the chart).
"""

from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path

from sluice.cli.errors import CliError
from sluice.common.client_security import TLSConfig

__all__ = ["ADMIN", "LocalAuth"]

ADMIN = "admin"
TOKEN_BYTES = 32


def _write_secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the start (never readable by others, not even
    for a moment), by rename so a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.chmod(tmp, 0o600)  # an existing file keeps its mode through O_CREAT
    os.replace(tmp, path)


def _read_or_make(path: Path, make: str) -> tuple[str, bool]:
    """The secret in ``path`` (and False), or ``make`` written there (and True)."""
    try:
        value = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        value = ""
    if value:
        path.chmod(0o600)
        return value, False
    _write_secret(path, make)
    return make, True


class LocalAuth:
    """The cluster token, the admin's password, the services' flags and the banner's lines."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir
        self.token_file = data_dir / "cluster.token"
        self.password_file = data_dir / "admin.password"
        self.cluster_token, _ = _read_or_make(
            self.token_file, base64.b64encode(secrets.token_bytes(TOKEN_BYTES)).decode()
        )

    def service_args(self) -> list[str]:
        return [
            "--auth-mechanisms", "scram", "--authorization", "acl", "--super-users", ADMIN,
            "--cluster-token-file", str(self.token_file),
        ]  # fmt: skip

    def create_admin(self, bootstrap: str, tls: TLSConfig | None, timeout: float) -> None:
        """Make sure the user ``admin`` exists with the password in ``admin.password`` (a new random
        one the first time). Called once the coordinator is up; it acts as the cluster."""
        from sluice import Client  # the SDK pulls in gRPC, which the rest of `sluice up` does not need
        from sluice.errors import SluiceError

        password, new = _read_or_make(self.password_file, secrets.token_urlsafe(24))
        try:
            with Client(bootstrap, client_id="sluice-up", request_timeout=timeout, tls=tls,
                        token=self.cluster_token) as client:  # fmt: skip
                # An existing admin keeps its password (and its sessions): the file is what it was
                # made with, unless someone changed it on purpose.
                if new or all(u.name != ADMIN for u in client.admin.list_users()):
                    client.admin.upsert_user(ADMIN, password)
        except SluiceError as exc:
            raise CliError("AUTH_SETUP_FAILED", f"could not create the user {ADMIN}: {exc}") from None

    def banner(self, tls_ca: Path | None) -> list[str]:
        ca = f" SLUICE_TLS_CA={tls_ca}" if tls_ca is not None else ""
        return [
            f"Authentication and ACLs on; super user {ADMIN!r}, password in {self.password_file}.",
            "Connect with:",
            f"  export SLUICE_USERNAME={ADMIN} SLUICE_PASSWORD=$(cat {self.password_file}){ca}",
        ]
