"""``sluice.v1.Quotas`` over gRPC, hosted by the coordinator: quota management and its long poll.

- ``AlterQuotas`` / ``DeleteQuotas`` / ``DescribeQuotas``: validated (InvalidArgument naming the
  field), stored by ``quota_store.py`` under the coordinator's epoch, audited.
- ``WatchQuotas``: every broker's and dispatcher's copy (``sluice.quotas.poller``), as
  ``Acls.WatchSecurity`` (``acl_servicer.py``): a caller at another version gets every quota at once,
  otherwise the call waits on an event every change sets, up to ``max_wait_ms``.

Only the leader serves. Permission checks are the guard's (``alter`` / ``describe`` on the cluster,
``cluster_action`` for the watch).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from grpc import aio

from sluice.common.timeouts import within
from sluice.coordinator.acl_servicer import MAX_ENTRIES, MAX_WAIT_MS, Leadership
from sluice.coordinator.quota_store import QuotaStore
from sluice.errors import InvalidArgument, NotCoordinator, SluiceError
from sluice.quotas.model import (
    Kind,
    Limits,
    QuotaKey,
    entity_from_proto,
    limits_from_proto,
    quota_to_proto,
)
from sluice.security.audit import audit_change
from sluice.security.model import ANONYMOUS, Principal
from sluice.server.runtime import Registrar
from sluice.v1 import quota_pb2 as pb
from sluice.v1 import quota_pb2_grpc

__all__ = ["QuotaServicer", "quota_registrar"]

Context = aio.ServicerContext[Any, Any]
PrincipalOf = Callable[[Context], Principal]


def _anonymous(_context: Context) -> Principal:
    return ANONYMOUS


class QuotaServicer(quota_pb2_grpc.QuotasServicer):
    def __init__(
        self, store: QuotaStore, leadership: Leadership, *, principal_of: PrincipalOf = _anonymous
    ) -> None:
        self._store = store
        self._leadership = leadership
        self._principal_of = principal_of
        self._changed = asyncio.Event()
        self._closing = False

    def close(self) -> None:
        """Answer every waiting poll now (a server stopping must not wait out max_wait_ms)."""
        self._closing = True
        self._changed.set()

    async def AlterQuotas(self, request: pb.AlterQuotasRequest, context: Context) -> pb.AlterQuotasResponse:
        quotas: dict[QuotaKey, Limits] = {}
        for i, q in enumerate(_bounded(request.quotas, "quotas")):
            try:
                quotas[entity_from_proto(q.entity)] = limits_from_proto(q.limits)
            except SluiceError as exc:
                raise InvalidArgument(f"quotas[{i}]: {exc.message}") from None
        self._guard()
        async with self._fencing():
            changed, version = await self._store.alter(self._leadership.epoch, quotas)
        if changed:
            detail = {"quotas": {str(k): v.to_dict() for k, v in quotas.items()}}
            self._changed_by(context, "quota.alter", detail)
        return pb.AlterQuotasResponse(version=version)

    async def DeleteQuotas(
        self, request: pb.DeleteQuotasRequest, context: Context
    ) -> pb.DeleteQuotasResponse:
        keys: list[QuotaKey] = []
        for i, e in enumerate(_bounded(request.entities, "entities")):
            try:
                keys.append(entity_from_proto(e))
            except SluiceError as exc:
                raise InvalidArgument(f"entities[{i}]: {exc.message}") from None
        self._guard()
        async with self._fencing():
            deleted, version = await self._store.delete(self._leadership.epoch, keys)
        if deleted:
            self._changed_by(context, "quota.delete", {"entities": [str(k) for k in keys]})
        return pb.DeleteQuotasResponse(deleted=deleted, version=version)

    async def DescribeQuotas(
        self, request: pb.DescribeQuotasRequest, context: Context
    ) -> pb.DescribeQuotasResponse:
        kind: Kind | None = None
        if request.kind:
            try:
                kind = Kind(request.kind)
            except ValueError:
                raise InvalidArgument(f"kind {request.kind[:40]!r} is not one of: user, client") from None
        self._guard()
        snapshot = await self._store.load()
        quotas = [quota_to_proto(k, v) for k, v in snapshot if kind is None or k.kind is kind]
        return pb.DescribeQuotasResponse(quotas=quotas, version=snapshot.version)

    async def WatchQuotas(self, request: pb.WatchQuotasRequest, context: Context) -> pb.WatchQuotasResponse:
        self._guard()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(request.max_wait_ms, MAX_WAIT_MS) / 1000
        while True:
            changed = self._changed  # taken before the read: a change after it sets this event
            version = await self._store.version()
            if version != request.known_version:
                snapshot = await self._store.load()
                return pb.WatchQuotasResponse(
                    changed=True, version=snapshot.version, quotas=[quota_to_proto(k, v) for k, v in snapshot]
                )
            remaining = deadline - loop.time()
            if remaining <= 0 or self._closing:
                return pb.WatchQuotasResponse(changed=False, version=version)
            with contextlib.suppress(TimeoutError):
                await within(changed.wait(), remaining)

    def _guard(self) -> None:
        election = self._leadership.election
        if election is not None:
            election.guard()

    @contextlib.asynccontextmanager
    async def _fencing(self) -> AsyncIterator[None]:
        try:
            yield
        except NotCoordinator:
            election = self._leadership.election
            if election is not None:
                election.fenced()
            raise

    def _changed_by(self, context: Context, action: str, detail: Mapping[str, object]) -> None:
        audit_change(self._principal_of(context), action, detail, context.peer())
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


def _bounded(items: Any, what: str) -> Any:
    if not items:
        raise InvalidArgument(f"no {what} given")
    if len(items) > MAX_ENTRIES:
        raise InvalidArgument(f"{len(items)} {what} in one request; at most {MAX_ENTRIES}")
    return items


def quota_registrar(servicer: QuotaServicer) -> Registrar:
    def register(server: aio.Server) -> None:
        quota_pb2_grpc.add_QuotasServicer_to_server(servicer, server)

    return register
