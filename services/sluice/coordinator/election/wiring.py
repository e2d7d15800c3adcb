"""The election as the coordinator process uses it: settings from the config, one object for main, the
service layer and the servicer, and a gRPC server that starts the election once its port is bound.

Life of a replica (``--election redis|kubernetes``):

1. the gRPC server starts serving at once, as a standby: ``Metadata`` is forwarded to the leader, every
   other RPC gets ``NOT_COORDINATOR`` naming the leader (guard.py, forward.py);
2. once the port is bound the election starts (the lease carries this replica's address);
3. on winning, ``on_elected(epoch)`` = ``CoordinatorService.start(epoch)``: rebuild the state from Redis
   under the new epoch. Only when it returns does ``is_leader()`` turn true and requests get served;
4. on losing (renew deadline passed, lease taken, fenced by the store), ``is_leader()`` turns false at
   once and requests are refused again; a later win runs ``start(epoch)`` again, rebuilding everything;
5. on SIGTERM the leader resigns: it releases the lease, so a standby takes over without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from redis.asyncio import Redis

from sluice.coordinator.election.base import Elector, OnElected, OnLost
from sluice.coordinator.election.forward import MetadataForwarder
from sluice.coordinator.election.guard import leader_guard
from sluice.coordinator.election.kubernetes_elector import KubernetesLeaseElector, LeaseApi, default_api
from sluice.coordinator.election.loop import ElectionLoop
from sluice.coordinator.election.machine import ElectionTiming, LeaderInfo
from sluice.coordinator.election.redis_elector import RedisElector
from sluice.errors import InvalidArgument, NotCoordinator
from sluice.server.runtime import GrpcServer
from sluice.v1 import coordinator_pb2 as pb

__all__ = [
    "BACKENDS",
    "CoordinatorElection",
    "ElectingGrpcServer",
    "ElectionConfig",
    "ElectionSettings",
    "default_identity",
    "validate_election",
]

log = logging.getLogger(__name__)

BACKENDS = ("redis", "kubernetes", "none")


class ElectionConfig(Protocol):
    """The ``CoordinatorConfig`` fields the election reads (see docs/election.md for the flags).

    Read-only properties, so the frozen config satisfies it."""

    @property
    def key_prefix(self) -> str: ...
    @property
    def election(self) -> str: ...
    @property
    def lease_name(self) -> str: ...
    @property
    def lease_namespace(self) -> str: ...
    @property
    def identity(self) -> str: ...
    @property
    def lease_duration(self) -> timedelta: ...
    @property
    def renew_deadline(self) -> timedelta: ...
    @property
    def retry_period(self) -> timedelta: ...


def default_identity() -> str:
    """``$POD_NAME`` in Kubernetes (unique among live pods), else ``<hostname>:<pid>``."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}:{os.getpid()}"


def validate_election(config: ElectionConfig) -> None:
    """Reject contradictory election settings, naming the flag. Caller: ``CoordinatorConfig.validate``."""
    if config.election not in BACKENDS:
        raise InvalidArgument(f"--election {config.election!r}: expected one of {', '.join(BACKENDS)}")
    if config.election == "none":
        return
    ElectionSettings.timing_of(config)  # raises InvalidArgument naming the three flags
    if config.election == "kubernetes":
        if not config.lease_name:
            raise InvalidArgument("--election kubernetes needs --lease-name (the chart sets it)")
        if not (config.lease_namespace or os.environ.get("POD_NAMESPACE")):
            raise InvalidArgument("--election kubernetes needs --lease-namespace (or $POD_NAMESPACE)")


@dataclass(frozen=True)
class ElectionSettings:
    backend: str
    key_prefix: str
    identity: str
    lease_name: str
    lease_namespace: str
    timing: ElectionTiming

    @staticmethod
    def timing_of(config: ElectionConfig) -> ElectionTiming:
        return ElectionTiming(
            lease_duration=config.lease_duration.total_seconds(),
            renew_deadline=config.renew_deadline.total_seconds(),
            retry_period=config.retry_period.total_seconds(),
        )

    @classmethod
    def from_config(cls, config: ElectionConfig) -> ElectionSettings:
        validate_election(config)
        return cls(
            backend=config.election,
            key_prefix=config.key_prefix,
            identity=config.identity or default_identity(),
            lease_name=config.lease_name,
            lease_namespace=config.lease_namespace or os.environ.get("POD_NAMESPACE", ""),
            timing=cls.timing_of(config),
        )


async def _nothing() -> None:
    return None


class CoordinatorElection:
    """This replica's election, for the coordinator.

    Caller: main (``attach``, ``start``, ``close``), the service layer (``guard``, ``fenced``), the
    servicer (``is_leader``, ``forward_metadata``).
    """

    def __init__(
        self, settings: ElectionSettings, redis: Redis, lease_api: Callable[[], LeaseApi] = default_api
    ) -> None:
        self.settings = settings
        self._redis = redis
        self._lease_api = lease_api
        self._on_elected: OnElected | None = None
        self._on_lost: OnLost = _nothing
        self._elector: ElectionLoop | None = None
        self._forwarder: MetadataForwarder | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def from_config(cls, config: ElectionConfig, redis: Redis) -> CoordinatorElection | None:
        """None for ``--election none`` (every coordinator start takes a new epoch, as before)."""
        settings = ElectionSettings.from_config(config)
        return None if settings.backend == "none" else cls(settings, redis)

    @property
    def elector(self) -> Elector | None:
        """The elector once started (None before the server's port is bound)."""
        return self._elector

    def attach(self, on_elected: OnElected, on_lost: OnLost | None = None) -> None:
        """What to run on winning (``CoordinatorService.start(epoch)``) and on losing."""
        self._on_elected = on_elected
        self._on_lost = on_lost or _nothing

    def start(self, address: str) -> None:
        """Stand for leader, advertising ``address`` (host:port) to clients. Caller: ElectingGrpcServer."""
        assert self._on_elected is not None, "attach() the coordinator service first"
        assert self._elector is None, "the election starts once"
        s = self.settings
        elector: ElectionLoop
        if s.backend == "redis":
            elector = RedisElector(self._redis, s.key_prefix, s.identity, address, s.timing)
        else:
            elector = KubernetesLeaseElector(
                self._lease_api(),
                s.lease_name,
                s.lease_namespace,
                self._redis,
                s.key_prefix,
                s.identity,
                address,
                s.timing,
            )
        self._elector = elector
        self._forwarder = MetadataForwarder(elector)
        self._task = asyncio.get_running_loop().create_task(
            elector.run(self._on_elected, self._on_lost), name="coordinator-election"
        )
        self._task.add_done_callback(_report_end)

    # ---- for the service layer and the servicer ------------------------------------------------------

    def is_leader(self) -> bool:
        return self._elector is not None and self._elector.is_leader()

    def leader(self) -> LeaderInfo | None:
        return self._elector.leader() if self._elector is not None else None

    def guard(self) -> None:
        """Raise NOT_COORDINATOR naming the leader unless this replica is the serving leader."""
        if self._elector is None:
            raise NotCoordinator("not the leader; no leader is elected yet (this replica is starting)")
        leader_guard(self._elector)

    def fenced(self) -> None:
        """The metadata store refused our epoch: step down and stand again (see Elector.fenced)."""
        if self._elector is not None:
            self._elector.fenced()

    async def forward_metadata(
        self, request: pb.MetadataRequest, invocation_metadata: Iterable[Any] | None = None
    ) -> pb.MetadataResponse:
        """A standby's ``Metadata``: the leader's answer (forwarded), or NOT_COORDINATOR."""
        if self._forwarder is None:
            self.guard()
        assert self._forwarder is not None
        return await self._forwarder.metadata(request, invocation_metadata)

    async def close(self) -> None:
        """Resign (a standby takes over at once) and stop. Idempotent."""
        if self._elector is not None:
            await self._elector.resign()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._forwarder is not None:
            await self._forwarder.close()


def _report_end(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the coordinator election stopped: %r", task.exception())


@dataclass
class ElectingGrpcServer(GrpcServer):
    """A ``GrpcServer`` that starts the election right after binding: the lease carries this replica's
    address, which is known only then (``--port 0``)."""

    election: CoordinatorElection | None = None
    advertised_host: str = ""

    async def start(self) -> int:
        port = await super().start()
        if self.election is not None:
            self.election.start(f"{self.advertised_host or self.host}:{port}")
        return port
