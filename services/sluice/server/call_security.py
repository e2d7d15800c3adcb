"""The security steps of one gRPC method: authenticate the call, apply its guard, track a stream.

The interceptor (``sluice.server.interceptors``) builds one :class:`MethodSecurity` per method, once,
and runs it around every call when the service's security is active. The guard of each method comes
from ``sluice.security.guards`` (one table for every service).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from grpc import aio

from sluice.errors import SluiceError
from sluice.security.audit import audit_unauthenticated
from sluice.security.authenticate import ANONYMOUS_CALLER, Authenticated
from sluice.security.context import GRPC, RequestContext, current, set_current
from sluice.security.guards import Guard, Kind, guard_for
from sluice.security.live_streams import LiveStream
from sluice.security.model import Resource
from sluice.security.rate_limit import client_host
from sluice.security.service import ServiceSecurity, lower_keys

__all__ = ["MethodSecurity", "StreamEnd"]


class StreamEnd:
    """Why a stream was ended from outside (its credentials expired, or it lost a right): the
    stream's task is cancelled, and the wrapper turns the cancellation into this error."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: SluiceError | None = None


class MethodSecurity:
    def __init__(self, security: ServiceSecurity, method: str) -> None:
        self._security = security
        self.guard: Guard = guard_for(method)
        self._open = self.guard.kind is Kind.OPEN
        self._request_checks = self.guard.kind in (Kind.REQUEST, Kind.CLUSTER)

    async def authenticate(self, context: aio.ServicerContext[Any, Any]) -> Authenticated | None:
        """Who calls (None for an open method). Raises AuthenticationError to refuse."""
        if self._open:
            return None
        security = self._security
        authenticator = security.authenticator
        if not authenticator.enabled:
            return ANONYMOUS_CALLER
        metadata = lower_keys(context.invocation_metadata())
        cert = None
        if security.grpc_cert_principal is not None:
            cert = security.grpc_cert_principal(context.auth_context())
        host = client_host(context.peer())
        try:
            now = authenticator.authenticate_now(metadata, cert, host)
            return now if now is not None else await authenticator.authenticate(metadata, cert, host)
        except SluiceError as err:
            audit_unauthenticated(security.service, context.peer(), err)
            raise

    def begin_call(self, who: Authenticated, context: aio.ServicerContext[Any, Any], request: Any) -> None:
        """Make the call's context current (every coroutine of this call's task sees it: each call
        runs in its own task, so nothing needs resetting) and authorize what the request names."""
        ctx = RequestContext(who.principal, GRPC, address=context.peer())
        set_current(ctx)
        self.check(ctx, request)

    def begin_stream(
        self, who: Authenticated, context: aio.ServicerContext[Any, Any], end: StreamEnd
    ) -> LiveStream:
        """Track the current task's stream and make its context current. Ending the stream from
        outside (expiry, a lost right) cancels the task with ``end.error`` set."""
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - grpc runs every call in a task
            raise RuntimeError("a stream outside a task")

        def stop(err: SluiceError) -> None:
            end.error = err
            task.cancel()

        address = context.peer()
        stream = self._security.streams.open(who.principal, address, who.expires_at, who.credentials, stop)
        set_current(RequestContext(who.principal, GRPC, address=address, stream=stream))
        return stream

    def end_stream(self, stream: LiveStream) -> None:
        self._security.streams.close(stream)

    def check(self, ctx: RequestContext, message: Any) -> None:
        """Authorize what ``message`` names (a request or cluster guard); the core checks the rest."""
        if not self._request_checks:
            return
        authorize = self._security.authorizer.authorize
        for item in self.guard.checks:
            for name in item.names(message):
                authorize(ctx, item.operation, Resource(item.resource_type, name))

    def checked_requests(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """The client's stream of messages, each authorized as it arrives (a later message naming
        an unauthorized resource ends the stream with PERMISSION_DENIED)."""
        if not self._request_checks:
            return requests

        async def checked() -> AsyncIterator[Any]:
            async for message in requests:
                self.check(current(), message)
                yield message

        return checked()
