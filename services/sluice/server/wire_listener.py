"""The listening side of the wire protocol (``docs/wire.md``): :class:`WireListener` accepts a service's
wire connections (``server/wire.py``'s :class:`WireConnection`) and holds what they share (limits, TLS,
security, the connection gate and gauge)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

from prometheus_client import Gauge

from sluice.common.wire import PROTOCOL_VERSION
from sluice.security.service import ServiceSecurity
from sluice.security.tls import ServerTLS
from sluice.server.config import ConnectionSettings
from sluice.server.limits import connection_settings
from sluice.server.wire_gate import ConnectionGate, Policed

__all__ = ["Listened", "WireListener"]


class Listened(Policed, Protocol):
    """What the listener needs of its connections (``server/wire.py``'s ``WireConnection``, an
    ``asyncio.BufferedProtocol``): the gate's policing, and closing them when it stops."""

    def close(self) -> None: ...


_GAUGES: dict[str, Gauge] = {}


def _connections_gauge(service: str) -> Gauge:
    """``sluice_<service>_wire_connections``: one per service and process (the default registry)."""
    name = f"sluice_{service.replace('-', '_')}_wire_connections"
    gauge = _GAUGES.get(name)
    if gauge is None:
        gauge = _GAUGES[name] = Gauge(name, "Open wire-protocol connections (past the hello)")
    return gauge


class WireListener:
    """Listens on a service's wire port. ``start()`` returns the bound port; ``stop()`` is idempotent."""

    def __init__(
        self,
        service: str,
        connection: Callable[[WireListener], Listened],
        host: str,
        port: int,
        security: ServiceSecurity | None = None,
        max_frame_bytes: int | None = None,
        version: int = PROTOCOL_VERSION,
        tls: ServerTLS | None = None,
        limits: ConnectionSettings | None = None,
    ) -> None:
        self.service = service
        #: The connection limits (docs/limits.md, "Connections"; None: the process's).
        self.limits = limits = limits if limits is not None else connection_settings()
        #: TLS on this port (None: plaintext). A connection's peer certificate, for the
        #: authenticator: ``transport.get_extra_info("ssl_object")``.
        self.tls = tls
        #: The highest protocol version this service speaks (a connection speaks the lower of
        #: it and the client's).
        self.version = version
        self._connection = connection
        self.host = host
        self.port = port
        #: None when nothing is checked (no authentication, no authorization).
        self.security = security if security is not None and security.active else None
        self.max_frame_bytes = max_frame_bytes if max_frame_bytes is not None else limits.max_frame_bytes
        self.bound_port = 0
        #: Who is let in and put out (``server/wire_gate.py``).
        self.gate: ConnectionGate[Listened] = ConnectionGate(service, limits)
        self.connections = self.gate.connections
        self.metrics = self.gate.metrics
        self.connections_gauge = _connections_gauge(service)
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        tls = self.tls
        if tls is None:
            self._server = await loop.create_server(self._plain_connection, self.host, self.port)
        else:
            # The handshake counts against the hello's time: a client that starts one and stalls
            # is dropped as one that never says hello is (asyncio's own default is 60 s).
            self._server = await loop.create_server(
                lambda: self._tls_connection(tls),
                self.host,
                self.port,
                ssl=tls.ssl_context(),
                ssl_handshake_timeout=self.limits.hello_timeout.total_seconds(),
            )
        self.bound_port = self._server.sockets[0].getsockname()[1]
        self.gate.start()
        return self.bound_port

    def _tls_connection(self, tls: ServerTLS) -> asyncio.BaseProtocol:
        """A connection on a TLS port: the certificate files are checked for a change first (once a
        second at most), so this handshake and later ones present a rotated certificate."""
        tls.maybe_reload()
        return self._plain_connection()

    def _plain_connection(self) -> asyncio.BaseProtocol:
        # A Listened is a WireConnection, an asyncio protocol; the Protocol type cannot say both.
        return cast(asyncio.BaseProtocol, self._connection(self))

    async def stop(self) -> None:
        """Stop accepting, then close every connection (after what was already written)."""
        if self._server is not None:
            self._server.close()
            self._server = None
        await self.gate.stop()
        for conn in list(self.connections):
            conn.close()
