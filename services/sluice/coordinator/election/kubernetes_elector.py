"""Leader election on a ``coordination.k8s.io/v1`` Lease (the coordinator Deployment in the Helm chart).

The Lease is the election; Redis (the metadata store) still needs the fencing epoch. Why the Lease alone
cannot fence: the Lease lives in the Kubernetes API server, the metadata lives in Redis, and no write can
be made conditional on both. A deposed leader that stalled (GC pause, network partition) past its renew
deadline would still write to Redis unless Redis itself knows it was deposed. So, after winning the
Lease, the new leader takes the next coordinator epoch (``INCR <prefix>:coordinator:epoch``) - the token
``MetadataStore``'s Lua fence checks on every write - and records it in the Lease for people and
followers to see (annotation ``sluice.io/epoch``). From then on an older leader's writes are refused.

The two steps are not one transaction. If a winner stalls *between* them past its deadline, it steps
down without using its epoch, but its late INCR may land after the next leader's and fence *that* one;
the next leader's first write is then refused, it resigns (``Elector.fenced``) and a fresh election
fixes it. Safety holds throughout (no two writers); only liveness pays, and only in that rare case.

Lease mechanics follow client-go's LeaseLock: read, then create (absent) or replace with the
``resourceVersion`` read (optimistic concurrency: a 409 Conflict means someone else wrote first);
``holderIdentity``, ``leaseDurationSeconds``, ``acquireTime``, ``renewTime``, ``leaseTransitions`` (+1 when
the holder changes). The Kubernetes client is synchronous, so every call runs in a thread.
The address clients are redirected to is annotation ``sluice.io/leader-address``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import time
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from sluice.coordinator.election.base import Candidate
from sluice.coordinator.election.loop import Clock, ElectionLoop
from sluice.coordinator.election.machine import ElectionTiming, LeaseRecord
from sluice.coordinator.election.redis_elector import epoch_key
from sluice.errors import StorageError

__all__ = ["ADDRESS_ANNOTATION", "EPOCH_ANNOTATION", "KubernetesLeaseElector", "LeaseApi", "LeaseStoreK8s"]

ADDRESS_ANNOTATION = "sluice.io/leader-address"
EPOCH_ANNOTATION = "sluice.io/epoch"
#: Seconds one API call may take (connect, read) before it counts as failed.
REQUEST_TIMEOUT = (3.0, 5.0)


class LeaseApi(Protocol):
    """The three ``kubernetes.client.CoordinationV1Api`` methods this elector calls."""

    def read_namespaced_lease(self, name: str, namespace: str, *, _request_timeout: Any = None) -> Any: ...

    def create_namespaced_lease(self, namespace: str, body: Any, *, _request_timeout: Any = None) -> Any: ...

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: Any, *, _request_timeout: Any = None
    ) -> Any: ...


def micro_time(now: dt.datetime) -> dt.datetime:
    """A Lease time the API server accepts. Its MicroTime format needs exactly six fractional digits,
    and the client serializes with ``isoformat()``, which omits them when microsecond == 0."""
    return now if now.microsecond else now.replace(microsecond=1)


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) else None


class LeaseStoreK8s:
    """The ``LeaseStore`` on one Lease, plus the Redis epoch. Caller: ``KubernetesLeaseElector``."""

    def __init__(
        self,
        api: LeaseApi,
        name: str,
        namespace: str,
        redis: Redis,
        key_prefix: str,
        wall: Any = None,
    ) -> None:
        self._api = api
        self.name = name
        self.namespace = namespace
        self._redis = redis
        self.epoch_key = epoch_key(key_prefix)
        self._wall = wall or (lambda: dt.datetime.now(dt.UTC))
        #: The last Lease object read or written: replace() must send the object of the version it expects.
        self._latest: Any = None

    # ---- LeaseStore --------------------------------------------------------------------------------

    async def read(self) -> LeaseRecord | None:
        lease = await self._call("read", self._api.read_namespaced_lease, self.name, self.namespace)
        self._latest = lease
        return None if lease is None else self._record(lease)

    async def acquire(
        self, expected: LeaseRecord | None, candidate: Candidate
    ) -> tuple[bool, LeaseRecord | None]:
        from kubernetes import client

        now = micro_time(self._wall())
        duration = max(1, math.ceil(candidate.lease_duration))
        if expected is None:
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(
                    name=self.name,
                    namespace=self.namespace,
                    annotations={ADDRESS_ANNOTATION: candidate.address, EPOCH_ANNOTATION: "0"},
                ),
                spec=client.V1LeaseSpec(
                    holder_identity=candidate.identity,
                    lease_duration_seconds=duration,
                    acquire_time=now,
                    renew_time=now,
                    lease_transitions=0,
                ),
            )
            lease = await self._call("create", self._api.create_namespaced_lease, self.namespace, body)
        else:
            base = self._object_of(expected)
            if base is None:
                return False, None
            body = base.model_copy(deep=True)
            spec = body.spec
            if spec.holder_identity != candidate.identity:
                spec.lease_transitions = (spec.lease_transitions or 0) + 1
            spec.holder_identity = candidate.identity
            spec.lease_duration_seconds = duration
            spec.acquire_time = now
            spec.renew_time = now
            body.metadata.annotations = {
                **(body.metadata.annotations or {}),
                ADDRESS_ANNOTATION: candidate.address,
                EPOCH_ANNOTATION: "0",
            }
            lease = await self._call("replace", self._replace, body)
        if lease is None:
            return False, None  # 409/404: someone else wrote first
        self._latest = lease
        # Won the Lease. Now the fencing epoch; without it we must not lead, so give the Lease back.
        try:
            epoch = int(await self._redis.incr(self.epoch_key))
        except RedisError as exc:
            await self.release(self._record(lease))
            raise StorageError(f"won the Lease but cannot take an epoch in Redis: {exc}") from exc
        body = lease.model_copy(deep=True)
        body.metadata.annotations = {**(body.metadata.annotations or {}), EPOCH_ANNOTATION: str(epoch)}
        recorded = await self._call("replace", self._replace, body)
        if recorded is None:
            return False, None
        self._latest = recorded
        return True, self._record(recorded)

    async def renew(self, held: LeaseRecord) -> tuple[bool, LeaseRecord | None]:
        base = self._object_of(held)
        if base is not None:
            lease = await self._renewed(base)
            if lease is not None:
                return True, self._record(lease)
        # A conflict, or our cached object is stale. If the Lease is still ours (same holder and epoch,
        # e.g. an earlier renewal timed out on our side but went through), renew on top of it once.
        current = await self.read()
        if current is None or (current.holder, current.epoch) != (held.holder, held.epoch):
            return False, current
        lease = await self._renewed(self._latest)
        return (True, self._record(lease)) if lease is not None else (False, None)

    async def _renewed(self, base: Any) -> Any:
        body = base.model_copy(deep=True)
        body.spec.renew_time = micro_time(self._wall())
        lease = await self._call("replace", self._replace, body)
        self._latest = lease
        return lease

    async def release(self, held: LeaseRecord) -> None:
        base = self._object_of(held)
        if base is None:
            return
        body = base.model_copy(deep=True)
        # client-go's release: no holder, a 1 s duration, the transition count kept.
        body.spec.holder_identity = None
        body.spec.lease_duration_seconds = 1
        body.spec.renew_time = micro_time(self._wall())
        annotations = dict(body.metadata.annotations or {})
        annotations.pop(ADDRESS_ANNOTATION, None)
        body.metadata.annotations = annotations
        lease = await self._call("replace", self._replace, body)
        self._latest = lease

    async def close(self) -> None:
        """The API client and Redis belong to the caller."""

    # ---- internals ---------------------------------------------------------------------------------

    def _replace(self, body: Any, *, _request_timeout: Any = None) -> Any:
        return self._api.replace_namespaced_lease(
            self.name, self.namespace, body, _request_timeout=_request_timeout
        )

    def _object_of(self, record: LeaseRecord) -> Any:
        latest = self._latest
        if latest is not None and latest.metadata.resource_version == record.version:
            return latest
        return None

    async def _call(self, what: str, method: Any, *args: Any) -> Any:
        """Run one API call in a thread. 404 and 409 mean "not there" / "someone else wrote first": None.
        Anything else is a StorageError (the elector treats it as an unreachable store)."""
        try:
            return await asyncio.to_thread(method, *args, _request_timeout=REQUEST_TIMEOUT)
        except Exception as exc:  # ApiException, urllib3 and socket errors, a malformed answer
            status = _status(exc)
            if status in (404, 409):
                return None
            raise StorageError(
                f"Lease {self.namespace}/{self.name}: {what} failed: {status or type(exc).__name__} {exc}"
            ) from exc

    def _record(self, lease: Any) -> LeaseRecord:
        spec = lease.spec
        annotations = lease.metadata.annotations or {}
        try:
            epoch = int(annotations.get(EPOCH_ANNOTATION, "0") or 0)
        except ValueError:
            epoch = 0
        return LeaseRecord(
            holder=spec.holder_identity or "",
            address=annotations.get(ADDRESS_ANNOTATION, ""),
            epoch=epoch,
            duration=float(spec.lease_duration_seconds or 0),
            version=str(lease.metadata.resource_version),
            transitions=int(spec.lease_transitions or 0),
        )


def default_api() -> LeaseApi:
    """A real ``CoordinationV1Api``: in-cluster credentials (the pod's ServiceAccount), else kubeconfig."""
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config  # its loaders are untyped
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise StorageError(
                "--election kubernetes: no in-cluster service account and no usable kubeconfig "
                f"({exc}); use --election redis outside Kubernetes"
            ) from exc
    api: LeaseApi = client.CoordinationV1Api()
    return api


class KubernetesLeaseElector(ElectionLoop):
    """``Elector`` on a Lease; the epoch handed to ``on_elected`` comes from Redis (see module doc)."""

    backend = "kubernetes"

    def __init__(
        self,
        api: LeaseApi,
        lease_name: str,
        namespace: str,
        redis: Redis,
        key_prefix: str,
        identity: str,
        address: str,
        timing: ElectionTiming,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        self.lease_store = LeaseStoreK8s(api, lease_name, namespace, redis, key_prefix)
        super().__init__(self.lease_store, identity, address, timing, clock=clock)
