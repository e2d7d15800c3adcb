"""Which check guards each RPC: one table for every service, enforced by the interceptor.

Every method a Sluice server registers has exactly one entry here, keyed by its full gRPC name
(``/sluice.v1.Broker/Produce``); ``tests/integration/security/test_guards.py`` walks the proto
descriptors and fails for a method with no entry, and calls each one to prove the check holds. A guard
is one of:

- ``open``: no credentials needed (the health service, reflection, the SCRAM login itself);
- ``cluster``: an internal RPC (services calling each other): ``cluster_action`` on the cluster;
- ``request``: the interceptor authorizes ``operation`` on every resource the request names before the
  handler runs (for a stream, every message the client sends); a refusal ends the call;
- ``core``: the service's core authorizes each resource itself, because it answers per partition
  or per item (a produce naming an unauthorized topic among others gets that partition refused, the
  rest written). The entry records what the core asks, for the docs and the test;
- ``filtered``: a list (topics, groups, subscriptions) filtered to what the caller may describe.

Why a table in one place and not checks spread over the servicers: a new RPC cannot be added without
deciding its guard (the test fails), and a reviewer sees the whole authorization surface at once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sluice.security.model import Operation, ResourceType

__all__ = ["GUARDS", "Guard", "Kind", "guard_for"]


class Kind(enum.Enum):
    OPEN = "open"
    CLUSTER = "cluster"
    REQUEST = "request"
    CORE = "core"
    FILTERED = "filtered"


Names = Callable[[Any], Iterable[str]]


@dataclass(frozen=True)
class Check:
    operation: Operation
    resource_type: ResourceType
    #: The names of the resources a request message asks about ("" for the cluster).
    names: Names


@dataclass(frozen=True)
class Guard:
    kind: Kind
    checks: tuple[Check, ...] = ()


def _one(field: str) -> Names:
    return lambda msg: (getattr(msg, field),)


def _cluster(_msg: Any) -> Iterable[str]:
    return ("",)


def _heartbeat_group(msg: Any) -> Iterable[str]:
    return (msg.heartbeat.group,) if msg.HasField("heartbeat") else ()


def _topics_of(field: str) -> Names:
    return lambda msg: {item.topic for item in getattr(msg, field)}


def _reset_topics(msg: Any) -> Iterable[str]:
    names = {t.topic for t in msg.topics}
    if msg.topic:
        names.add(msg.topic)
    return names


def check(op: Operation, rtype: ResourceType, names: Names) -> Check:
    return Check(op, rtype, names)


def request(*checks: Check) -> Guard:
    return Guard(Kind.REQUEST, checks)


def core(*checks: Check) -> Guard:
    """What the core asks; ``names`` is unused (the core knows its resources)."""
    return Guard(Kind.CORE, checks)


def cluster(op: Operation = Operation.CLUSTER_ACTION) -> Guard:
    return Guard(Kind.CLUSTER, (Check(op, ResourceType.CLUSTER, _cluster),))


def filtered(op: Operation, rtype: ResourceType) -> Guard:
    return Guard(Kind.FILTERED, (Check(op, rtype, _cluster),))


OPEN = Guard(Kind.OPEN)
R, W, D = Operation.READ, Operation.WRITE, Operation.DESCRIBE
TOPIC, GROUP, SUB, CLUSTER = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.SUBSCRIPTION,
    ResourceType.CLUSTER,
)

GUARDS: dict[str, Guard] = {
    # ---- broker -------------------------------------------------------------------------------
    "/sluice.v1.Broker/Produce": core(check(W, TOPIC, _cluster)),
    "/sluice.v1.Broker/ProduceStream": core(check(W, TOPIC, _cluster)),
    # A follower's fetch (replica_id >= 0) needs cluster_action instead (the core decides).
    "/sluice.v1.Broker/Fetch": core(check(R, TOPIC, _cluster)),
    "/sluice.v1.Broker/FetchStream": core(check(R, TOPIC, _cluster)),
    "/sluice.v1.Broker/ListOffsets": core(check(D, TOPIC, _cluster)),
    "/sluice.v1.Broker/OffsetForLeaderEpoch": core(check(D, TOPIC, _cluster)),
    "/sluice.v1.Broker/UpdatePartitions": core(
        check(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, _cluster)
    ),
    # ---- coordinator: the cluster's own calls ---------------------------------------------------
    "/sluice.v1.Coordinator/RegisterBroker": cluster(),
    "/sluice.v1.Coordinator/BrokerHeartbeat": cluster(),
    "/sluice.v1.Coordinator/RegisterDispatcher": cluster(),
    "/sluice.v1.Coordinator/AlterPartition": cluster(),
    "/sluice.v1.Coordinator/ControlledShutdown": cluster(),
    # ---- coordinator: topics --------------------------------------------------------------------
    "/sluice.v1.Coordinator/CreateTopic": request(check(Operation.CREATE, TOPIC, _one("name"))),
    "/sluice.v1.Coordinator/DeleteTopic": request(check(Operation.DELETE, TOPIC, _one("name"))),
    "/sluice.v1.Coordinator/AddPartitions": request(check(Operation.ALTER, TOPIC, _one("name"))),
    "/sluice.v1.Coordinator/AlterTopic": request(check(Operation.ALTER_CONFIGS, TOPIC, _one("name"))),
    "/sluice.v1.Coordinator/ListTopics": filtered(D, TOPIC),
    "/sluice.v1.Coordinator/DescribeTopic": request(check(D, TOPIC, _one("name"))),
    "/sluice.v1.Coordinator/Metadata": filtered(D, TOPIC),
    # Idempotent producers: allowed with write on any topic (Kafka's KIP-679); the servicer decides.
    "/sluice.v1.Coordinator/InitProducerId": core(check(W, TOPIC, _cluster)),
    "/sluice.v1.Coordinator/ElectLeaders": cluster(Operation.ALTER),
    "/sluice.v1.Coordinator/ReassignPartitions": cluster(Operation.ALTER),
    "/sluice.v1.Coordinator/RecoverPartition": cluster(Operation.ALTER),
    # ---- coordinator: groups --------------------------------------------------------------------
    "/sluice.v1.Coordinator/Heartbeat": request(check(R, GROUP, _one("group"))),
    "/sluice.v1.Coordinator/ConsumerGroupStream": request(check(R, GROUP, _heartbeat_group)),
    "/sluice.v1.Coordinator/LeaveGroup": request(check(R, GROUP, _one("group"))),
    "/sluice.v1.Coordinator/ListGroups": filtered(D, GROUP),
    "/sluice.v1.Coordinator/DescribeGroup": request(check(D, GROUP, _one("group"))),
    "/sluice.v1.Coordinator/SetGroupConfig": request(check(Operation.ALTER_CONFIGS, GROUP, _one("group"))),
    "/sluice.v1.Coordinator/DeleteGroup": request(check(Operation.DELETE, GROUP, _one("group"))),
    # ---- offset store: a group member's offsets (read on the group and on each topic, as Kafka) -----
    "/sluice.v1.OffsetStore/CommitOffsets": request(
        check(R, GROUP, _one("group")), check(R, TOPIC, _topics_of("offsets"))
    ),
    "/sluice.v1.OffsetStore/FetchOffsets": request(
        check(D, GROUP, _one("group")), check(D, TOPIC, _topics_of("partitions"))
    ),
    # A reset rewrites where a group reads: alter on the group, read on the topics.
    "/sluice.v1.OffsetStore/ResetOffsets": request(
        check(Operation.ALTER, GROUP, _one("group")), check(R, TOPIC, _reset_topics)
    ),
    # ---- offset store: the dispatcher's cursors and registry -----------------------------------------
    "/sluice.v1.OffsetStore/SaveCursors": cluster(),
    "/sluice.v1.OffsetStore/LoadCursor": cluster(),
    "/sluice.v1.OffsetStore/TouchSubscriptions": cluster(),
    "/sluice.v1.OffsetStore/ListStoredSubscriptions": cluster(),
    "/sluice.v1.OffsetStore/DeleteSubscriptionState": cluster(),
    # ---- dispatcher: its core checks the subscriber's own rights (it reads as the cluster) ------------
    "/sluice.v1.Dispatcher/Consume": core(check(R, TOPIC, _cluster), check(R, SUB, _cluster)),
    "/sluice.v1.Dispatcher/ListSubscriptions": filtered(D, SUB),
    "/sluice.v1.Dispatcher/DescribeSubscription": core(check(D, SUB, _cluster), check(D, TOPIC, _cluster)),
    "/sluice.v1.Dispatcher/ResetSubscription": core(check(Operation.ALTER, SUB, _cluster)),
    "/sluice.v1.Dispatcher/SkipSubscription": core(check(Operation.ALTER, SUB, _cluster)),
    "/sluice.v1.Dispatcher/DeleteSubscription": core(check(Operation.DELETE, SUB, _cluster)),
    "/sluice.v1.Dispatcher/PeekSubscription": core(check(R, SUB, _cluster), check(R, TOPIC, _cluster)),
    "/sluice.v1.Dispatcher/ListParkedKeys": core(check(D, SUB, _cluster), check(D, TOPIC, _cluster)),
    "/sluice.v1.Dispatcher/UnparkKey": core(check(Operation.ALTER, SUB, _cluster)),
    # ---- coordinator: ACLs (the Acls service). WatchSecurity hands out every ACL and user name:
    # only the services' own watchers call it.
    "/sluice.v1.Acls/CreateAcls": cluster(Operation.ALTER),
    "/sluice.v1.Acls/DeleteAcls": cluster(Operation.ALTER),
    "/sluice.v1.Acls/DescribeAcls": cluster(D),
    "/sluice.v1.Acls/WatchSecurity": cluster(),
    # ---- coordinator: client quotas (the Quotas service, docs/quotas.md). WatchQuotas is the
    # services' own long poll.
    "/sluice.v1.Quotas/AlterQuotas": cluster(Operation.ALTER),
    "/sluice.v1.Quotas/DeleteQuotas": cluster(Operation.ALTER),
    "/sluice.v1.Quotas/DescribeQuotas": cluster(D),
    "/sluice.v1.Quotas/WatchQuotas": cluster(),
    # ---- coordinator: users (the Auth service). The SCRAM login is how a client gets credentials.
    "/sluice.v1.Auth/Authenticate": OPEN,
    "/sluice.v1.Auth/UpsertUser": cluster(Operation.ALTER),
    "/sluice.v1.Auth/DeleteUser": cluster(Operation.ALTER),
    "/sluice.v1.Auth/ListUsers": cluster(D),
    # ---- open: probes carry no credentials ------------------------------------------------------------
    "/grpc.health.v1.Health/Check": OPEN,
    "/grpc.health.v1.Health/Watch": OPEN,
    "/grpc.health.v1.Health/List": OPEN,
}


def guard_for(method: str) -> Guard:
    """The guard of ``method``; an unknown method (a registration this table missed) is refused by
    the interceptor as if it needed the cluster, never left open."""
    return GUARDS.get(method, _UNLISTED)


_UNLISTED = cluster()
