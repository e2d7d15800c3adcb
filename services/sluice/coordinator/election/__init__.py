"""Coordinator leader election: one leader among coordinator replicas, standbys that redirect.

- ``machine.py``: the pure state machine (no I/O, no clock);
- ``base.py``: the ``Elector`` interface and the ``LeaseStore`` a backend provides;
- ``loop.py``: the driver shared by both electors;
- ``redis_elector.py``: a lease on a Redis key (``sluice up``); ``kubernetes_elector.py``: a
  ``coordination.k8s.io`` Lease (the Helm chart);
- ``guard.py``, ``forward.py``: how a standby answers; ``wiring.py``: what the coordinator process uses.

See docs/election.md.
"""

from sluice.coordinator.election.base import Candidate, Elector, LeaseStore
from sluice.coordinator.election.guard import leader_guard, leader_hint, not_leader
from sluice.coordinator.election.kubernetes_elector import KubernetesLeaseElector
from sluice.coordinator.election.machine import (
    Action,
    ElectionMachine,
    ElectionState,
    ElectionTiming,
    LeaderInfo,
    LeaseRecord,
)
from sluice.coordinator.election.redis_elector import RedisElector
from sluice.coordinator.election.wiring import (
    BACKENDS,
    CoordinatorElection,
    ElectingGrpcServer,
    ElectionConfig,
    ElectionSettings,
    default_identity,
    validate_election,
)

__all__ = [
    "BACKENDS",
    "Action",
    "Candidate",
    "CoordinatorElection",
    "ElectingGrpcServer",
    "ElectionConfig",
    "ElectionMachine",
    "ElectionSettings",
    "ElectionState",
    "ElectionTiming",
    "Elector",
    "KubernetesLeaseElector",
    "LeaderInfo",
    "LeaseRecord",
    "LeaseStore",
    "RedisElector",
    "default_identity",
    "leader_guard",
    "leader_hint",
    "not_leader",
    "validate_election",
]
