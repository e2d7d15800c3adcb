"""TLS on a service's listeners, with certificates re-read when their files change (docs/security.md, "TLS").

One :class:`ServerTLS` per process, built from the service's :class:`SecuritySettings`; it gives

- :meth:`ServerTLS.grpc_credentials`: ``grpc.dynamic_ssl_server_credentials`` whose fetcher gRPC
  calls at every handshake. It compares the files' mtimes (at most one ``stat`` round per second)
  and hands gRPC a new certificate configuration only when they changed;
- :meth:`ServerTLS.ssl_context`: the one ``ssl.SSLContext`` of the wire-protocol listeners.
  :meth:`ServerTLS.maybe_reload` (called by the listener on each accepted connection, throttled
  the same way) loads the changed chain into that same context, so new handshakes present it and
  connections already open keep theirs.

So cert-manager may rotate a Secret under a running pod: new connections get the new certificate
with no restart. A rotation caught half-written (the new key beside the old certificate) fails to
load; the old files stay in use and the next check tries again.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from sluice.errors import InvalidArgument
from sluice.security.settings import CLIENT_AUTH_MODES, SecuritySettings

__all__ = ["RELOAD_CHECK_S", "ServerTLS", "server_tls"]

log = logging.getLogger(__name__)

#: How often, at most, the certificate files are stat'ed for a change.
RELOAD_CHECK_S = 1.0


def _mtimes(paths: tuple[Path, ...]) -> tuple[int, ...]:
    out = []
    for path in paths:
        try:
            out.append(os.stat(path).st_mtime_ns)
        except OSError:
            out.append(-1)
    return tuple(out)


class ServerTLS:
    """The TLS material of one service process; see the module docstring."""

    def __init__(self, cert: Path, key: Path, ca: Path | None = None, client_auth: str = "none") -> None:
        if client_auth not in CLIENT_AUTH_MODES:
            raise InvalidArgument(f"tls_client_auth must be one of {', '.join(CLIENT_AUTH_MODES)}")
        if client_auth != "none" and ca is None:
            raise InvalidArgument(f"tls_client_auth={client_auth} needs tls_ca (the clients' CA)")
        self.cert, self.key, self.ca = Path(cert), Path(key), Path(ca) if ca is not None else None
        self.client_auth = client_auth
        self._paths = (self.cert, self.key) + ((self.ca,) if self.ca is not None else ())
        self._lock = threading.Lock()
        self._next_check = 0.0
        self._mtimes = _mtimes(self._paths)
        self._pem = self._read()  # raises a typed error for missing or unreadable files
        self._grpc_config = self._grpc_configuration(self._pem)
        #: The SSL contexts made so far, by client-auth mode (the wire listeners', the metrics port's).
        self._contexts: dict[str, ssl.SSLContext] = {}
        #: Bumped at every reload that took: tests and logs read it.
        self.generation = 0
        #: The generation gRPC was last handed.
        self._grpc_given = 0

    # ---- reading the files ------------------------------------------------------------------

    def _read(self) -> tuple[bytes, bytes, bytes | None]:
        try:
            cert, key = self.cert.read_bytes(), self.key.read_bytes()
            ca = self.ca.read_bytes() if self.ca is not None else None
        except OSError as exc:
            raise InvalidArgument(f"TLS files: {exc}") from exc
        return cert, key, ca

    def _grpc_configuration(
        self, pem: tuple[bytes, bytes, bytes | None]
    ) -> grpc.ServerCertificateConfiguration:
        cert, key, ca = pem
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def _load_into(self, context: ssl.SSLContext) -> None:
        context.load_cert_chain(str(self.cert), str(self.key))
        if self.ca is not None:
            context.load_verify_locations(cafile=str(self.ca))

    def _changed(self) -> tuple[int, ...] | None:
        """The files' new mtimes when they changed since the last load (checked once a second)."""
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + RELOAD_CHECK_S
        mtimes = _mtimes(self._paths)
        return mtimes if mtimes != self._mtimes else None

    def maybe_reload(self) -> bool:
        """Re-read the files if they changed; whether a new certificate is now served. Cheap when
        nothing changed (a clock read, and a ``stat`` per file once a second)."""
        with self._lock:
            mtimes = self._changed()
            if mtimes is None:
                return False
            try:
                pem = self._read()
                config = self._grpc_configuration(pem)
                for context in self._contexts.values():
                    self._load_into(context)
            except (InvalidArgument, ssl.SSLError, OSError, ValueError, RuntimeError) as exc:
                # Half-written (a new key beside the old certificate): keep serving the old
                # ones, try again at the next check.
                log.warning("TLS files changed but do not load yet (%s): serving the previous ones", exc)
                return False
            self._mtimes, self._pem, self._grpc_config = mtimes, pem, config
            self.generation += 1
            log.info("TLS certificate reloaded from %s", self.cert)
            return True

    # ---- gRPC -------------------------------------------------------------------------------

    def _fetch_grpc_config(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher, called at every handshake: a new configuration only on a change (made
        here or found by the wire listener's check)."""
        self.maybe_reload()
        if self._grpc_given == self.generation:
            return None
        self._grpc_given = self.generation
        return self._grpc_config

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Server credentials that follow the files. gRPC's Python API has only "require and
        verify" or "do not ask" for client certificates: ``request`` is "do not ask" on gRPC (the
        wire port asks); docs/security.md says so."""
        # The stubs say the fetcher returns a configuration; gRPC documents None as "no change".
        fetch: Callable[[], grpc.ServerCertificateConfiguration] = self._fetch_grpc_config  # type: ignore[assignment]
        return grpc.dynamic_ssl_server_credentials(
            self._grpc_config,
            fetch,
            require_client_authentication=self.client_auth == "require",
        )

    # ---- the wire protocol --------------------------------------------------------------------

    def ssl_context(self, client_auth: str | None = None) -> ssl.SSLContext:
        """The wire listeners' context (one per process and mode, reloaded in place).
        ``client_auth``: another mode than the service's (the metrics port asks for none)."""
        mode = client_auth or self.client_auth
        with self._lock:
            context = self._contexts.get(mode)
            if context is None:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                self._load_into(context)
                context.verify_mode = {
                    "none": ssl.CERT_NONE,
                    "request": ssl.CERT_OPTIONAL,
                    "require": ssl.CERT_REQUIRED,
                }[mode]
                self._contexts[mode] = context
            return context


def server_tls(settings: SecuritySettings) -> ServerTLS | None:
    """The service's TLS from its settings; None (plaintext) without ``tls_cert``."""
    if settings.tls_cert is None:
        if settings.tls_key is not None:
            raise InvalidArgument("tls_key is set without tls_cert")
        return None
    if settings.tls_key is None:
        raise InvalidArgument("tls_cert is set without tls_key")
    return ServerTLS(settings.tls_cert, settings.tls_key, settings.tls_ca, settings.tls_client_auth)
