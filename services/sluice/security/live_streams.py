"""Streams and connections that outlive a check: ended when their rights or credentials go.

gRPC metadata (and the wire hello) is sent once, when a stream or connection opens, so a check made
then would hold for its whole life. Kafka re-authenticates long connections (KIP-368); Sluice ends
them instead, and the SDK reconnects with fresh credentials:

- when the credentials expire (a JWT's ``exp``, a session token's lifetime): one event-loop timer per
  stream, armed at open;
- when the ACLs change under it: every resource a check allowed on the stream is remembered
  (:meth:`LiveStream.remember`), and :meth:`LiveStreams.recheck` asks the authorizer again for each;
  a refusal ends the stream with ``PERMISSION_DENIED``;
- when its user is deleted or changes password (a session token's generation is behind the
  user's): :meth:`LiveStreams.recheck` runs the credential check the authenticator attached.

A check costs a set lookup (``remember``) on the request path; the rechecks run only on a change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from sluice.errors import AuthorizationError, CredentialsExpired, SluiceError
from sluice.security.model import Operation, Principal, Resource

if TYPE_CHECKING:
    from sluice.security.context import Authorizer, RequestContext

__all__ = ["CredentialCheck", "LiveStream", "LiveStreams"]

log = logging.getLogger(__name__)

#: Re-validates a stream's credentials after the users changed: None while they hold, else the error.
CredentialCheck = Callable[[], SluiceError | None]


class LiveStream:
    """One open stream (gRPC) or connection (wire) and what it was allowed."""

    __slots__ = ("_end", "address", "credentials", "ended", "expires_at", "grants", "principal", "timer")

    def __init__(
        self,
        principal: Principal,
        address: str,
        expires_at: float | None,
        credentials: CredentialCheck | None,
        end: Callable[[SluiceError], None],
    ) -> None:
        self.principal = principal
        self.address = address
        #: Wall-clock seconds (``time.time()``) when its credentials expire; None: they do not.
        self.expires_at = expires_at
        self.credentials = credentials
        self.grants: set[tuple[Operation, Resource]] = set()
        self.ended = False
        self._end = end
        self.timer: asyncio.TimerHandle | None = None

    def remember(self, operation: Operation, resource: Resource) -> None:
        self.grants.add((operation, resource))

    def end(self, err: SluiceError) -> None:
        """End it with ``err`` (once); the transport's callback sends the error and closes."""
        if self.ended:
            return
        self.ended = True
        if self.timer is not None:
            self.timer.cancel()
        log.info("ending a stream of %r from %s: %s", self.principal.name, self.address, err.message)
        self._end(err)


class LiveStreams:
    """Every live stream of one service process."""

    def __init__(self) -> None:
        self._streams: set[LiveStream] = set()

    def __len__(self) -> int:
        return len(self._streams)

    def open(
        self,
        principal: Principal,
        address: str,
        expires_at: float | None,
        credentials: CredentialCheck | None,
        end: Callable[[SluiceError], None],
    ) -> LiveStream:
        """Track a stream; when ``expires_at`` passes it is ended with ``UNAUTHENTICATED``.
        Call from the event loop."""
        stream = LiveStream(principal, address, expires_at, credentials, end)
        self._streams.add(stream)
        if expires_at is not None:
            loop = asyncio.get_running_loop()
            delay = max(0.0, expires_at - time.time())
            stream.timer = loop.call_later(delay, self._expire, stream)
        return stream

    def close(self, stream: LiveStream) -> None:
        """The stream ended on its own: forget it."""
        stream.ended = True
        if stream.timer is not None:
            stream.timer.cancel()
        self._streams.discard(stream)

    def _expire(self, stream: LiveStream) -> None:
        self._streams.discard(stream)
        stream.end(CredentialsExpired("the credentials of this stream expired: reconnect with fresh ones"))

    def recheck(self, authorizer: Authorizer, context_of: Callable[[LiveStream], RequestContext]) -> int:
        """After the ACLs or the users changed: end every stream whose credentials no longer hold or
        that lost a right it used. Returns how many were ended."""
        ended = 0
        for stream in list(self._streams):
            err = self._first_failure(stream, authorizer, context_of)
            if err is not None:
                self._streams.discard(stream)
                stream.end(err)
                ended += 1
        return ended

    @staticmethod
    def _first_failure(
        stream: LiveStream, authorizer: Authorizer, context_of: Callable[[LiveStream], RequestContext]
    ) -> SluiceError | None:
        if stream.credentials is not None:
            err = stream.credentials()
            if err is not None:
                return err
        ctx = context_of(stream)
        for operation, resource in list(stream.grants):
            if not authorizer.allowed(ctx, operation, resource):
                return AuthorizationError(f"not authorized to {operation.value} {resource} any more")
        return None
