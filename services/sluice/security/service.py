"""One service process's security: who callers are, what they may do, and their live streams.

Built once at a service's start from its settings and handed to both transports (the gRPC server's
interceptor, the wire listeners). ``active`` is False on a cluster with neither authentication nor
authorization: then the transports skip every step here, and a request costs what it did before
security existed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from sluice.common.timeouts import within
from sluice.security.acl import AclAuthorizer
from sluice.security.authenticate import ServerAuthenticator
from sluice.security.context import GRPC, AllowAll, Authorizer, RequestContext
from sluice.security.live_streams import LiveStream, LiveStreams
from sluice.security.watcher import SecurityWatcher

__all__ = ["ServiceSecurity"]

log = logging.getLogger(__name__)

#: How long a starting service waits for its first ACL snapshot before it announces itself ready.
SYNC_WAIT_S = 10.0

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
        acls: AclAuthorizer | None = None,
        watcher: SecurityWatcher | None = None,
    ) -> None:
        self.service = service
        self.authenticator = authenticator or ServerAuthenticator()
        self.authorizer: Authorizer = authorizer or AllowAll()
        self.streams = LiveStreams()
        self.grpc_cert_principal = grpc_cert_principal
        self.wire_cert_principal = wire_cert_principal
        self.active = self.authenticator.enabled or bool(getattr(self.authorizer, "enabled", False))
        #: The ACL engine (the coordinator replaces its set from its own store; other services'
        #: watchers from the coordinator's snapshots).
        self.acls = acls
        self.watcher = watcher

    @property
    def watched(self) -> bool:
        """Whether this service needs the coordinator's ACLs and users (authorization on, or
        session tokens whose generations it must check)."""
        return bool(getattr(self.authorizer, "enabled", False)) or self.authenticator.checks_sessions

    def user_generations(self) -> Mapping[str, int]:
        return self.watcher.user_generations if self.watcher is not None else {}

    def watch(self, coordinator: str) -> None:
        """Follow ``coordinator``'s ACLs and users (the coordinator follows its own address)."""
        if self.watched and self.acls is not None and self.watcher is None and coordinator:
            self.watcher = SecurityWatcher(coordinator, self.acls)

    def start(self) -> None:
        if self.watcher is not None:
            self.watcher.start()

    async def wait_synced(self) -> None:
        """Wait (bounded) for the first snapshot of ACLs and users, so a service announces itself
        ready only once it can decide; a coordinator that is down must not keep it from serving."""
        if self.watcher is None:
            return
        try:
            await within(self.watcher.synced.wait(), SYNC_WAIT_S)
        except TimeoutError:
            log.warning(
                "%s: no ACLs from the coordinator yet; serving, and denying until they come", self.service
            )

    async def stop(self) -> None:
        if self.watcher is not None:
            await self.watcher.stop()

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
