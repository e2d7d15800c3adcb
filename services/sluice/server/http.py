"""A service's HTTP port: ``/metrics`` (Prometheus) and ``/healthz`` (the probes' way in under TLS).

Why ``/healthz`` here: a kubelet gRPC probe cannot speak TLS, so once the gRPC port is TLS-only the
probes move to this port (``httpGet``; with ``--tls-metrics`` as ``scheme: HTTPS``, which the kubelet
does not verify). It answers 200 while the service's gRPC health is SERVING, else 503, and carries
no data. docs/security.md, "TLS", has the choice and the alternatives.

With ``--tls-metrics`` the port serves TLS with the service's certificate (reloaded as the other
listeners', at the next request after a change), never asking for a client certificate: Prometheus
scrapes with a CA, not a certificate of its own, in the usual setups.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from sluice.security.tls import ServerTLS

__all__ = ["start_http"]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per scrape or probe."""


def _app(serving: Callable[[], bool], tls: ServerTLS | None) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if tls is not None:
            tls.maybe_reload()
        if environ.get("PATH_INFO") == "/healthz":
            ok = serving()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"SERVING\n" if ok else b"NOT_SERVING\n"]
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    return app


def start_http(host: str, port: int, serving: Callable[[], bool], tls: ServerTLS | None) -> WSGIServer:
    """Serve on a daemon thread; ``shutdown()`` and ``server_close()`` stop it."""
    # The address family of the host (an IPv6 address or ``::`` too), as prometheus-client does.
    family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0][0]
    server_class: type[_Server] = type("_FamilyServer", (_Server,), {"address_family": family})
    httpd: WSGIServer = make_server(host, port, _app(serving, tls), server_class, handler_class=_QuietHandler)
    if tls is not None:
        httpd.socket = tls.ssl_context("none").wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, name="sluice-http", daemon=True).start()
    return httpd
