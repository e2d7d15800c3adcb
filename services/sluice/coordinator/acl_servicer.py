"""``sluice.v1.Acls`` over gRPC, hosted by the coordinator: ACL management and the security long poll.

- ``CreateAcls`` / ``DeleteAcls`` / ``DescribeAcls``: validated (InvalidArgument naming the field), stored by
  ``acl_store.py`` under the coordinator's epoch, audited (``sluice.security.audit.audit_change``).
- ``WatchSecurity``: the long poll every broker, dispatcher and offset store keeps open
  (``sluice.security.watcher``). A caller whose version differs from the stored one gets the full snapshot
  at once; otherwise the call waits on an asyncio event, set by every change this coordinator makes, for up
  to ``max_wait_ms``. The version is read from Redis on every call, so a change made elsewhere (another
  process bumping it) is seen by the next poll at the latest.

Only the leader serves (a standby answers NOT_COORDINATOR naming it, like every coordinator RPC), because
only the leader's changes wake the waiting polls. Permission checks are not made here: the integrator's
guard puts these RPCs behind ``alter`` / ``describe`` on the cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

from grpc import aio

from sluice.common.timeouts import within
from sluice.coordinator.acl_store import AclStore
from sluice.coordinator.election import CoordinatorElection
from sluice.errors import InvalidArgument, NotCoordinator, SluiceError
from sluice.security.acl import AclEntry, AclFilter
from sluice.security.acl_proto import entry_from_proto, entry_to_proto, filter_from_proto, filter_to_proto
from sluice.security.audit import audit_change
from sluice.security.model import ANONYMOUS, Principal
from sluice.server.runtime import Registrar
from sluice.v1 import acl_pb2 as pb
from sluice.v1 import acl_pb2_grpc

__all__ = ["MAX_ENTRIES", "MAX_WAIT_MS", "SERVICE_NAME", "AclServicer", "acl_registrar"]

Context = aio.ServicerContext[Any, Any]
SERVICE_NAME = "sluice.v1.Acls"

#: The longest a WatchSecurity call waits (a larger max_wait_ms is cut to this): a poll must come back
#: well within the proxies' and load balancers' idle timeouts.
MAX_WAIT_MS = 60_000
#: Entries or filters one request may carry.
MAX_ENTRIES = 1_000

UserGenerations = Callable[[], Awaitable[Mapping[str, int]]]
PrincipalOf = Callable[[Context], Principal]


class Leadership(Protocol):
    """What the servicer needs of the coordinator service: its term's epoch and its election."""

    @property
    def epoch(self) -> int: ...

    @property
    def election(self) -> CoordinatorElection | None: ...


async def no_users() -> Mapping[str, int]:
    return {}


def anonymous(_context: Context) -> Principal:
    return ANONYMOUS


class AclServicer(acl_pb2_grpc.AclsServicer):
    def __init__(
        self,
        store: AclStore,
        leadership: Leadership,
        *,
        user_generations: UserGenerations = no_users,
        principal_of: PrincipalOf = anonymous,
    ) -> None:
        self._store = store
        self._leadership = leadership
        #: User name -> credential generation, for the snapshot (the user store supplies it).
        self._user_generations = user_generations
        #: Who asks, for the audit log (the integrator supplies the request context's principal).
        self._principal_of = principal_of
        #: Set (and replaced) on every change this process makes: wakes the waiting polls.
        self._changed = asyncio.Event()
        self._closing = False
        self._snapshot: pb.SecuritySnapshot | None = None
        self._snapshot_lock = asyncio.Lock()

    # ---- for the coordinator process ----------------------------------------------------------------

    def notify_changed(self) -> None:
        """Wake every waiting WatchSecurity: the security version moved. Caller: this servicer after a
        change, and the user store after it bumped the version (``AclStore.bump_version``)."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def close(self) -> None:
        """Answer every waiting poll now (a server stopping must not wait out max_wait_ms)."""
        self._closing = True
        self._changed.set()

    # ---- management -----------------------------------------------------------------------------------

    async def CreateAcls(self, request: pb.CreateAclsRequest, context: Context) -> pb.CreateAclsResponse:
        entries = [_entry(i, m) for i, m in enumerate(_bounded(request.acls, "acls"))]
        self._guard()
        async with self._fencing():
            created, version = await self._store.add(self._leadership.epoch, entries)
        if created:
            self._changed_by(context, "acl.add", {"acls": [e.to_dict() for e in created]})
        return pb.CreateAclsResponse(created=len(created), version=version)

    async def DeleteAcls(self, request: pb.DeleteAclsRequest, context: Context) -> pb.DeleteAclsResponse:
        filters = [_filter(i, f) for i, f in enumerate(_bounded(request.filters, "filters"))]
        self._guard()
        async with self._fencing():
            deleted, version = await self._store.remove(self._leadership.epoch, filters)
        if deleted:
            detail = {
                "filters": [_filter_doc(filter_to_proto(f)) for f in filters],
                "acls": [e.to_dict() for e in deleted],
            }
            self._changed_by(context, "acl.remove", detail)
        return pb.DeleteAclsResponse(deleted=[entry_to_proto(e) for e in deleted], version=version)

    async def DescribeAcls(
        self, request: pb.DescribeAclsRequest, context: Context
    ) -> pb.DescribeAclsResponse:
        flt = filter_from_proto(request.filter)
        self._guard()
        acls = await self._store.load()
        return pb.DescribeAclsResponse(
            acls=[entry_to_proto(e) for e in acls.select(flt)], version=acls.version
        )

    # ---- distribution -----------------------------------------------------------------------------

    async def WatchSecurity(
        self, request: pb.WatchSecurityRequest, context: Context
    ) -> pb.WatchSecurityResponse:
        self._guard()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(request.max_wait_ms, MAX_WAIT_MS) / 1000
        while True:
            # Taken before the version is read: a change landing between the read and the wait sets
            # this very event, so it is never missed.
            changed = self._changed
            version = await self._store.version()
            # Any difference, not only a newer version: a Redis restored from an older backup must
            # bring the services back to what it holds, not leave them on versions it never had.
            if version != request.known_version:
                snapshot = await self._current_snapshot(version)
                return pb.WatchSecurityResponse(changed=True, snapshot=snapshot, version=snapshot.version)
            remaining = deadline - loop.time()
            if remaining <= 0 or self._closing:
                return pb.WatchSecurityResponse(changed=False, version=version)
            # On a timeout: one more look at the version, then "unchanged".
            with contextlib.suppress(TimeoutError):
                await within(changed.wait(), remaining)

    async def _current_snapshot(self, version: int) -> pb.SecuritySnapshot:
        """The snapshot at ``version`` or later, built once per version however many services ask."""
        async with self._snapshot_lock:
            cached = self._snapshot
            if cached is not None and cached.version >= version:
                return cached
            acls = await self._store.load()
            users = await self._user_generations()
            snapshot = pb.SecuritySnapshot(
                version=acls.version,
                acls=[entry_to_proto(e) for e in acls],
                user_generations=dict(users),
            )
            self._snapshot = snapshot
            return snapshot

    # ---- helpers --------------------------------------------------------------------------------------

    def _guard(self) -> None:
        election = self._leadership.election
        if election is not None:
            election.guard()

    @contextlib.asynccontextmanager
    async def _fencing(self) -> AsyncIterator[None]:
        """A write refused for our epoch means another coordinator took over: step down (as the metadata
        write path does), so this replica stops answering as the leader."""
        try:
            yield
        except NotCoordinator:
            election = self._leadership.election
            if election is not None:
                election.fenced()
            raise

    def _changed_by(self, context: Context, action: str, detail: Mapping[str, object]) -> None:
        audit_change(self._principal_of(context), action, detail, context.peer())
        self.notify_changed()


def _bounded(items: Any, what: str) -> Any:
    if not items:
        raise InvalidArgument(f"no {what} given")
    if len(items) > MAX_ENTRIES:
        raise InvalidArgument(f"{len(items)} {what} in one request; at most {MAX_ENTRIES}")
    return items


def _entry(i: int, msg: pb.AclEntry) -> AclEntry:
    try:
        return entry_from_proto(msg)
    except SluiceError as exc:
        raise InvalidArgument(f"acls[{i}]: {exc.message}") from None


def _filter(i: int, msg: pb.AclFilter) -> AclFilter:
    try:
        return filter_from_proto(msg)
    except SluiceError as exc:
        raise InvalidArgument(f"filters[{i}]: {exc.message}") from None


def _filter_doc(msg: pb.AclFilter) -> dict[str, str]:
    return {f.name: v for f, v in msg.ListFields()}


def acl_registrar(servicer: AclServicer) -> Registrar:
    """A ``GrpcServer`` registrar that adds the Acls servicer."""

    def register(server: aio.Server) -> None:
        acl_pb2_grpc.add_AclsServicer_to_server(servicer, server)

    return register
