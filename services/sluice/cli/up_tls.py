"""``sluice up --tls``: a private CA and certificates in ``<data-dir>/tls``, and the flags that use them.

The CA (``ca.crt``, ``ca.key``) is made once and kept, so a client configured with
``SLUICE_TLS_CA=<data-dir>/tls/ca.crt`` keeps working across restarts; every service's certificate
and the client certificate (``client.crt``, for trying mTLS) are issued again at each start, valid
for ``certs.DEFAULT_DAYS`` (short-lived certificates, not revocation lists: docs/security.md, "TLS").
"""

from __future__ import annotations

import socket
from pathlib import Path

from sluice.security import certs

__all__ = ["LocalTLS"]


class LocalTLS:
    """The TLS material of one ``sluice up``."""

    def __init__(self, data_dir: Path, hosts: list[str]) -> None:
        self.dir = data_dir / "tls"
        self._hosts = [h for h in dict.fromkeys([*hosts, socket.gethostname()]) if h]
        try:
            self._ca = certs.load_ca(self.dir)
        except (OSError, ValueError):
            self._ca = certs.write_ca(self.dir, "Sluice local CA")
        self.ca = self._ca.cert_path
        client = certs.issue(self._ca, self.dir, "client", client=True)
        self.client_cert, self.client_key = client.cert_path, client.key_path

    def service_args(self, name: str) -> list[str]:
        """Issue ``name``'s certificate; the flags that make the service serve (and call) with it."""
        issued = certs.issue(self._ca, self.dir, name, self._hosts)
        return [
            "--tls-cert", str(issued.cert_path), "--tls-key", str(issued.key_path),
            "--tls-ca", str(self.ca),
        ]  # fmt: skip

    def banner(self) -> list[str]:
        return [
            f"TLS on every port. Connect with: export SLUICE_TLS_CA={self.ca}",
            f"  (mTLS: SLUICE_TLS_CERT={self.client_cert} SLUICE_TLS_KEY={self.client_key})",
        ]
