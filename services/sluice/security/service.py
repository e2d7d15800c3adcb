"""One service process's security: who callers are, what they may do, and their live streams.

Built once at a service's start from its settings and handed to both transports (the gRPC server's
interceptor, the wire listeners). ``active`` is False on a cluster with neither authentication nor
authorization: then the transports skip every step here, and a request costs what it did before
security existed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sluice.security.authenticate import Authenticated, ServerAuthenticator
from sluice.security.context import GRPC, AllowAll, Authorizer, RequestContext, Transport
from sluice.security.live_streams import LiveStream, LiveStreams

__all__ = ["ServiceSecurity"]

#: Maps a transport's view of the peer's certificate (gRPC's auth context, or an SSL object) to a
#: principal name, or None when there is no certificate.
CertPrincipal = Callable[[Any], str | None]


class ServiceSecurity:
    def __init__(
        self,
        service: str,
        authenticator: ServerAuthenticator | None = None,
        authorizer: Authorizer | None = None,
        grpc_cert_principal: CertPrincipal | None = None,
        wire_cert_principal: CertPrincipal | None = None,
    ) -> None:
        self.service = service
        self.authenticator = authenticator or ServerAuthenticator()
        self.authorizer: Authorizer = authorizer or AllowAll()
        self.streams = LiveStreams()
        self.grpc_cert_principal = grpc_cert_principal
        self.wire_cert_principal = wire_cert_principal
        self.active = self.authenticator.enabled or bool(getattr(self.authorizer, "enabled", False))

    def context(
        self, who: Authenticated, transport: Transport, address: str, stream: LiveStream | None = None
    ) -> RequestContext:
        return RequestContext(who.principal, transport, address=address, stream=stream)

    def recheck_streams(self) -> int:
        """The ACLs or the users changed: end the streams that lost a right or their credentials."""
        self.authenticator.forget_sessions()
        return self.streams.recheck(self.authorizer, self._stream_context)

    @staticmethod
    def _stream_context(stream: LiveStream) -> RequestContext:
        return RequestContext(stream.principal, GRPC, address=stream.address, stream=stream)


def lower_keys(metadata: Any) -> Mapping[str, str]:
    """gRPC metadata (or a hello's map) as a dict with lower-case keys and str values."""
    out: dict[str, str] = {}
    for key, value in metadata or ():
        out[str(key).lower()] = value.decode() if isinstance(value, bytes) else str(value)
    return out
