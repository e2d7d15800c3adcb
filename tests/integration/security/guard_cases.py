"""One call per RPC, for the guard test: what each needs, written here independently of the guard table.

``CASES`` maps every RPC's full name to a :class:`Case`: the ACLs the call needs (``needs``; empty for an
open RPC) and ``call(channel, metadata, name)``, which sends a request naming ``name`` (a topic, group or
subscription; ignored where the resource is the cluster) and returns the error code it met: the RPC's
status, or the first per-item error of its answer (the broker answers per partition), or 0.

The requests are built so that a call allowed through does nothing harmful to the shared cluster: an
internal RPC carries a request its service refuses as invalid or stale after the guard, a topic deletion
names its own topic, and so on. Whether a call is *refused* is what the test reads.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import scramp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.codec.batch import BatchBuilder
from sluice.common.rpc import error_from_rpc
from sluice.security.model import Operation, ResourceType
from sluice.v1 import (
    acl_pb2,
    acl_pb2_grpc,
    auth_pb2,
    auth_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    dispatcher_pb2,
    dispatcher_pb2_grpc,
    offset_store_pb2,
    offset_store_pb2_grpc,
    quota_pb2,
    quota_pb2_grpc,
)

Metadata = tuple[tuple[str, str], ...]
Need = tuple[Operation, ResourceType]
Call = Callable[[grpc.Channel, Metadata, str], int]

R, W, D = Operation.READ, Operation.WRITE, Operation.DESCRIBE
TOPIC, GROUP, SUB, CLUSTER = (
    ResourceType.TOPIC,
    ResourceType.GROUP,
    ResourceType.SUBSCRIPTION,
    ResourceType.CLUSTER,
)
TIMEOUT = 10.0


@dataclass(frozen=True)
class Case:
    service: str  # which process serves it: broker, coordinator, offset-store, dispatcher
    needs: tuple[Need, ...]
    call: Call
    #: The resource name the call names when the default one would harm the cluster if allowed.
    name: str = "guarded"
    #: Whether the request names its resource (False: InitProducerId, allowed by write on any topic).
    names_resource: bool = True


def _unary(fn: Callable[[], Any]) -> Any:
    """Call; return the answer, or the error code of a refusal."""
    try:
        return fn()
    except grpc.RpcError as exc:
        return error_from_rpc(exc).code


def _code(answer: Any, items: str | None = None) -> int:
    """0 for an answer (or the first error of its ``items``), else the refusal's code."""
    if isinstance(answer, int):
        return answer
    if items is not None:
        for item in getattr(answer, items):
            if item.HasField("error") and item.error.code:
                return int(item.error.code)
    return 0


def _records() -> bytes:
    b = BatchBuilder()
    b.append(b"v", None, None, None, 1_000)
    return b.build()


def _stream(method: Callable[..., Any], first: Any, metadata: Metadata, items: str | None = None) -> int:
    """Open a stream, send ``first``, read one answer; its code (a refusal, or the first item error)."""
    requests: queue.Queue[Any] = queue.Queue()
    requests.put(first)

    def feed() -> Iterator[Any]:
        yield requests.get(timeout=TIMEOUT)
        # Keep the stream open until the answer is read (then cancelled): a client that half-closes
        # at once would make some servers end the call before they answer.
        while True:
            item = requests.get(timeout=TIMEOUT)
            if item is None:
                return
            yield item

    call = method(feed(), metadata=metadata, timeout=TIMEOUT)
    try:
        answer = next(call)
        code = _code(answer, items)
        if code == 0 and hasattr(answer, "error") and answer.HasField("error"):
            code = int(answer.error.code)
        return code
    except grpc.RpcError as exc:
        return error_from_rpc(exc).code
    finally:
        requests.put(None)
        call.cancel()


# ---- broker -----------------------------------------------------------------------------------------


def _broker(ch: grpc.Channel) -> broker_pb2_grpc.BrokerStub:
    return broker_pb2_grpc.BrokerStub(ch)


def _produce_request(name: str) -> broker_pb2.ProduceRequest:
    return broker_pb2.ProduceRequest(
        acks=1,
        timeout_ms=5000,
        partitions=[broker_pb2.ProducePartition(topic=name, partition=0, records=_records())],
    )


def _fetch_request(name: str) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(
        max_wait_ms=0, max_bytes=1 << 20, partitions=[broker_pb2.FetchPartition(topic=name, partition=0)]
    )


def produce(ch: grpc.Channel, md: Metadata, name: str) -> int:
    return _code(
        _unary(lambda: _broker(ch).Produce(_produce_request(name), metadata=md, timeout=TIMEOUT)),
        "partitions",
    )


def produce_stream(ch: grpc.Channel, md: Metadata, name: str) -> int:
    return _stream(_broker(ch).ProduceStream, _produce_request(name), md, "partitions")


def fetch(ch: grpc.Channel, md: Metadata, name: str) -> int:
    return _code(
        _unary(lambda: _broker(ch).Fetch(_fetch_request(name), metadata=md, timeout=TIMEOUT)), "partitions"
    )


def fetch_stream(ch: grpc.Channel, md: Metadata, name: str) -> int:
    return _stream(_broker(ch).FetchStream, _fetch_request(name), md, "partitions")


def list_offsets(ch: grpc.Channel, md: Metadata, name: str) -> int:
    req = broker_pb2.ListOffsetsRequest(
        partitions=[broker_pb2.ListOffsetsPartition(topic=name, partition=0, timestamp=-1)]
    )
    return _code(_unary(lambda: _broker(ch).ListOffsets(req, metadata=md, timeout=TIMEOUT)), "partitions")


def offset_for_leader_epoch(ch: grpc.Channel, md: Metadata, name: str) -> int:
    req = broker_pb2.OffsetForLeaderEpochRequest(
        partitions=[
            broker_pb2.OffsetForLeaderEpochPartition(
                topic=name, partition=0, leader_epoch=0, current_leader_epoch=-1
            )
        ]
    )
    return _code(
        _unary(lambda: _broker(ch).OffsetForLeaderEpoch(req, metadata=md, timeout=TIMEOUT)), "partitions"
    )


def update_partitions(ch: grpc.Channel, md: Metadata, name: str) -> int:
    # Version 0 and nothing in it: stale, a no-op once past the guard (never the wipe of the issue).
    req = broker_pb2.UpdatePartitionsRequest(metadata_version=0)
    return _code(_unary(lambda: _broker(ch).UpdatePartitions(req, metadata=md, timeout=TIMEOUT)))


# ---- coordinator ----------------------------------------------------------------------------------------


def _coord(ch: grpc.Channel) -> coordinator_pb2_grpc.CoordinatorStub:
    return coordinator_pb2_grpc.CoordinatorStub(ch)


def _c(method: str, request: Any) -> Call:
    def call(ch: grpc.Channel, md: Metadata, name: str) -> int:
        return _code(_unary(lambda: getattr(_coord(ch), method)(request(name), metadata=md, timeout=TIMEOUT)))

    return call


def metadata(ch: grpc.Channel, md: Metadata, name: str) -> int:
    answer = _unary(
        lambda: _coord(ch).Metadata(
            coordinator_pb2.MetadataRequest(topics=[name]), metadata=md, timeout=TIMEOUT
        )
    )
    if isinstance(answer, int):
        return answer
    return 100 if name in answer.unauthorized_topics else 0  # PERMISSION_DENIED, per topic


def list_topics(ch: grpc.Channel, md: Metadata, name: str) -> int:
    answer = _unary(
        lambda: _coord(ch).ListTopics(coordinator_pb2.ListTopicsRequest(), metadata=md, timeout=TIMEOUT)
    )
    if isinstance(answer, int):
        return answer
    return 0 if any(t.name == name for t in answer.topics) else 100  # filtered out: not allowed to see it


def list_groups(ch: grpc.Channel, md: Metadata, name: str) -> int:
    answer = _unary(
        lambda: _coord(ch).ListGroups(coordinator_pb2.ListGroupsRequest(), metadata=md, timeout=TIMEOUT)
    )
    if isinstance(answer, int):
        return answer
    return 0 if any(g.group == name for g in answer.groups) else 100


def _heartbeat(name: str) -> coordinator_pb2.GroupHeartbeatRequest:
    # An invalid member epoch: refused as a bad request after the guard, so no member joins.
    return coordinator_pb2.GroupHeartbeatRequest(
        group=name, member_id="nobody", member_epoch=7, subscription={"guarded": ""}
    )


def group_stream(ch: grpc.Channel, md: Metadata, name: str) -> int:
    return _stream(
        _coord(ch).ConsumerGroupStream, coordinator_pb2.GroupStreamRequest(heartbeat=_heartbeat(name)), md
    )


# ---- offset store -----------------------------------------------------------------------------------------


def _o(method: str, request: Callable[[str], Any]) -> Call:
    def call(ch: grpc.Channel, md: Metadata, name: str) -> int:
        stub = offset_store_pb2_grpc.OffsetStoreStub(ch)
        return _code(_unary(lambda: getattr(stub, method)(request(name), metadata=md, timeout=TIMEOUT)))

    return call


# ---- dispatcher ------------------------------------------------------------------------------------


def _d(method: str, request: Callable[[str], Any]) -> Call:
    def call(ch: grpc.Channel, md: Metadata, name: str) -> int:
        stub = dispatcher_pb2_grpc.DispatcherStub(ch)
        return _code(_unary(lambda: getattr(stub, method)(request(name), metadata=md, timeout=TIMEOUT)))

    return call


def list_subscriptions(ch: grpc.Channel, md: Metadata, name: str) -> int:
    stub = dispatcher_pb2_grpc.DispatcherStub(ch)
    answer = _unary(
        lambda: stub.ListSubscriptions(
            dispatcher_pb2.ListSubscriptionsRequest(topic="guarded"), metadata=md, timeout=TIMEOUT
        )
    )
    if isinstance(answer, int):
        return answer
    return 0 if any(s.subscription == name for s in answer.subscriptions) else 100


def consume(ch: grpc.Channel, md: Metadata, name: str) -> int:
    stub = dispatcher_pb2_grpc.DispatcherStub(ch)
    subscribe = dispatcher_pb2.ConsumerCommand(
        subscribe=dispatcher_pb2.Subscribe(topic="guarded", subscription=name, consumer_name="guard-test")
    )
    requests: queue.Queue[Any] = queue.Queue()
    requests.put(subscribe)

    def feed() -> Iterator[Any]:
        while True:
            item = requests.get(timeout=TIMEOUT)
            if item is None:
                return
            yield item

    call = stub.Consume(feed(), metadata=md, timeout=TIMEOUT)
    try:
        event = next(iter(call))
        return int(event.error.code) if event.HasField("error") else 0
    except grpc.RpcError as exc:
        return error_from_rpc(exc).code
    finally:
        requests.put(None)
        call.cancel()


# ---- ACLs, users, health ------------------------------------------------------------------------------


def _a(method: str, request: Any) -> Call:
    def call(ch: grpc.Channel, md: Metadata, name: str) -> int:
        stub = acl_pb2_grpc.AclsStub(ch)
        return _code(_unary(lambda: getattr(stub, method)(request, metadata=md, timeout=TIMEOUT)))

    return call


def _q(method: str, request: Any) -> Call:
    def call(ch: grpc.Channel, md: Metadata, name: str) -> int:
        stub = quota_pb2_grpc.QuotasStub(ch)
        return _code(_unary(lambda: getattr(stub, method)(request, metadata=md, timeout=TIMEOUT)))

    return call


def _u(method: str, request: Any) -> Call:
    def call(ch: grpc.Channel, md: Metadata, name: str) -> int:
        stub = auth_pb2_grpc.AuthStub(ch)
        return _code(_unary(lambda: getattr(stub, method)(request, metadata=md, timeout=TIMEOUT)))

    return call


def authenticate(ch: grpc.Channel, md: Metadata, name: str) -> int:
    """The SCRAM login is open: a client-first message is answered (a server-first), whoever asks."""
    first = scramp.ScramClient(["SCRAM-SHA-256"], "nobody", "wrong").get_client_first()
    return _stream(
        auth_pb2_grpc.AuthStub(ch).Authenticate,
        auth_pb2.AuthMessage(mechanism="SCRAM-SHA-256", scram=first.encode()),
        md,
    )


def health_check(ch: grpc.Channel, md: Metadata, name: str) -> int:
    stub = health_pb2_grpc.HealthStub(ch)
    return _code(_unary(lambda: stub.Check(health_pb2.HealthCheckRequest(), metadata=md, timeout=TIMEOUT)))


def health_list(ch: grpc.Channel, md: Metadata, name: str) -> int:
    stub = health_pb2_grpc.HealthStub(ch)
    return _code(_unary(lambda: stub.List(health_pb2.HealthListRequest(), metadata=md, timeout=TIMEOUT)))


def health_watch(ch: grpc.Channel, md: Metadata, name: str) -> int:
    stub = health_pb2_grpc.HealthStub(ch)
    call = stub.Watch(health_pb2.HealthCheckRequest(), metadata=md, timeout=TIMEOUT)
    try:
        next(call)
        return 0
    except grpc.RpcError as exc:
        return error_from_rpc(exc).code
    finally:
        call.cancel()


_CLUSTER_ACTION = ((Operation.CLUSTER_ACTION, CLUSTER),)

CASES: dict[str, Case] = {
    # broker
    "/sluice.v1.Broker/Produce": Case("broker", ((W, TOPIC),), produce),
    "/sluice.v1.Broker/ProduceStream": Case("broker", ((W, TOPIC),), produce_stream),
    "/sluice.v1.Broker/Fetch": Case("broker", ((R, TOPIC),), fetch),
    "/sluice.v1.Broker/FetchStream": Case("broker", ((R, TOPIC),), fetch_stream),
    "/sluice.v1.Broker/ListOffsets": Case("broker", ((D, TOPIC),), list_offsets),
    "/sluice.v1.Broker/OffsetForLeaderEpoch": Case("broker", ((D, TOPIC),), offset_for_leader_epoch),
    "/sluice.v1.Broker/UpdatePartitions": Case("broker", _CLUSTER_ACTION, update_partitions),
    # coordinator: internal
    "/sluice.v1.Coordinator/RegisterBroker": Case(
        "coordinator",
        _CLUSTER_ACTION,
        _c("RegisterBroker", lambda n: coordinator_pb2.RegisterBrokerRequest(broker_id=-5)),
    ),
    "/sluice.v1.Coordinator/BrokerHeartbeat": Case(
        "coordinator",
        _CLUSTER_ACTION,
        _c("BrokerHeartbeat", lambda n: coordinator_pb2.BrokerHeartbeatRequest(broker_id=-5)),
    ),
    "/sluice.v1.Coordinator/RegisterDispatcher": Case(
        "coordinator",
        _CLUSTER_ACTION,
        _c("RegisterDispatcher", lambda n: coordinator_pb2.RegisterDispatcherRequest()),
    ),
    "/sluice.v1.Coordinator/AlterPartition": Case(
        "coordinator",
        _CLUSTER_ACTION,
        _c("AlterPartition", lambda n: coordinator_pb2.AlterPartitionRequest(topic="", leader_id=-5)),
    ),
    "/sluice.v1.Coordinator/ControlledShutdown": Case(
        "coordinator",
        _CLUSTER_ACTION,
        _c("ControlledShutdown", lambda n: coordinator_pb2.ControlledShutdownRequest(broker_id=-5)),
    ),
    # coordinator: topics
    "/sluice.v1.Coordinator/CreateTopic": Case(
        "coordinator",
        ((Operation.CREATE, TOPIC),),
        _c("CreateTopic", lambda n: coordinator_pb2.CreateTopicRequest(name=n, partitions=0)),
    ),
    "/sluice.v1.Coordinator/DeleteTopic": Case(
        "coordinator",
        ((Operation.DELETE, TOPIC),),
        _c("DeleteTopic", lambda n: coordinator_pb2.DeleteTopicRequest(name=n)),
        name="doomed",
    ),
    "/sluice.v1.Coordinator/AddPartitions": Case(
        "coordinator",
        ((Operation.ALTER, TOPIC),),
        _c("AddPartitions", lambda n: coordinator_pb2.AddPartitionsRequest(name=n, partitions=0)),
    ),
    "/sluice.v1.Coordinator/AlterTopic": Case(
        "coordinator",
        ((Operation.ALTER_CONFIGS, TOPIC),),
        _c("AlterTopic", lambda n: coordinator_pb2.AlterTopicRequest(name=n, min_insync_replicas=-7)),
    ),
    "/sluice.v1.Coordinator/ListTopics": Case("coordinator", ((D, TOPIC),), list_topics),
    "/sluice.v1.Coordinator/DescribeTopic": Case(
        "coordinator",
        ((D, TOPIC),),
        _c("DescribeTopic", lambda n: coordinator_pb2.DescribeTopicRequest(name=n)),
    ),
    "/sluice.v1.Coordinator/Metadata": Case("coordinator", ((D, TOPIC),), metadata),
    "/sluice.v1.Coordinator/InitProducerId": Case(
        "coordinator",
        ((W, TOPIC),),
        _c(
            "InitProducerId",
            lambda n: coordinator_pb2.InitProducerIdRequest(
                client_id="guard", producer_id=-1, producer_epoch=-1
            ),
        ),
        names_resource=False,
    ),
    "/sluice.v1.Coordinator/ElectLeaders": Case(
        "coordinator",
        ((Operation.ALTER, CLUSTER),),
        _c("ElectLeaders", lambda n: coordinator_pb2.ElectLeadersRequest(topics=["guarded"])),
    ),
    "/sluice.v1.Coordinator/ReassignPartitions": Case(
        "coordinator",
        ((Operation.ALTER, CLUSTER),),
        _c("ReassignPartitions", lambda n: coordinator_pb2.ReassignPartitionsRequest()),
    ),
    "/sluice.v1.Coordinator/RecoverPartition": Case(
        "coordinator",
        ((Operation.ALTER, CLUSTER),),
        # A dry run: allowed, it only reports (the partition is not offline, so there is nothing to do).
        _c(
            "RecoverPartition",
            lambda n: coordinator_pb2.RecoverPartitionRequest(topic=n, partition=0, dry_run=True),
        ),
    ),
    # coordinator: groups
    "/sluice.v1.Coordinator/Heartbeat": Case("coordinator", ((R, GROUP),), _c("Heartbeat", _heartbeat)),
    "/sluice.v1.Coordinator/ConsumerGroupStream": Case("coordinator", ((R, GROUP),), group_stream),
    "/sluice.v1.Coordinator/LeaveGroup": Case(
        "coordinator",
        ((R, GROUP),),
        _c(
            "LeaveGroup",
            lambda n: coordinator_pb2.LeaveGroupRequest(group=n, member_id="nobody", member_epoch=-1),
        ),
    ),
    "/sluice.v1.Coordinator/ListGroups": Case("coordinator", ((D, GROUP),), list_groups),
    "/sluice.v1.Coordinator/DescribeGroup": Case(
        "coordinator",
        ((D, GROUP),),
        _c("DescribeGroup", lambda n: coordinator_pb2.DescribeGroupRequest(group=n)),
    ),
    "/sluice.v1.Coordinator/SetGroupConfig": Case(
        "coordinator",
        ((Operation.ALTER_CONFIGS, GROUP),),
        _c("SetGroupConfig", lambda n: coordinator_pb2.SetGroupConfigRequest(group=n)),
    ),
    "/sluice.v1.Coordinator/DeleteGroup": Case(
        "coordinator",
        ((Operation.DELETE, GROUP),),
        _c("DeleteGroup", lambda n: coordinator_pb2.DeleteGroupRequest(group=n)),
        name="nosuchgroup",
    ),
    # offset store
    "/sluice.v1.OffsetStore/CommitOffsets": Case(
        "offset-store",
        ((R, GROUP), (R, TOPIC)),
        _o(
            "CommitOffsets",
            lambda n: offset_store_pb2.CommitOffsetsRequest(
                group=n,
                member_id="nobody",
                member_epoch=-1,
                offsets=[offset_store_pb2.PartitionOffset(topic=n, partition=0, offset=0)],
            ),
        ),
    ),
    "/sluice.v1.OffsetStore/FetchOffsets": Case(
        "offset-store",
        ((D, GROUP), (D, TOPIC)),
        _o(
            "FetchOffsets",
            lambda n: offset_store_pb2.FetchOffsetsRequest(
                group=n, partitions=[common_pb2.TopicPartition(topic=n, partition=0)]
            ),
        ),
    ),
    "/sluice.v1.OffsetStore/ResetOffsets": Case(
        "offset-store",
        ((Operation.ALTER, GROUP), (R, TOPIC)),
        _o(
            "ResetOffsets",
            lambda n: offset_store_pb2.ResetOffsetsRequest(
                group=n, topic=n, spec=offset_store_pb2.RESET_SPEC_EARLIEST, dry_run=True
            ),
        ),
    ),
    "/sluice.v1.OffsetStore/SaveCursors": Case(
        "offset-store", _CLUSTER_ACTION, _o("SaveCursors", lambda n: offset_store_pb2.SaveCursorsRequest())
    ),
    "/sluice.v1.OffsetStore/LoadCursor": Case(
        "offset-store",
        _CLUSTER_ACTION,
        _o(
            "LoadCursor",
            lambda n: offset_store_pb2.LoadCursorRequest(topic="guarded", partition=0, subscription="none"),
        ),
    ),
    "/sluice.v1.OffsetStore/TouchSubscriptions": Case(
        "offset-store",
        _CLUSTER_ACTION,
        _o("TouchSubscriptions", lambda n: offset_store_pb2.TouchSubscriptionsRequest()),
    ),
    "/sluice.v1.OffsetStore/ListStoredSubscriptions": Case(
        "offset-store",
        _CLUSTER_ACTION,
        _o(
            "ListStoredSubscriptions",
            lambda n: offset_store_pb2.ListStoredSubscriptionsRequest(topic="guarded"),
        ),
    ),
    "/sluice.v1.OffsetStore/DeleteSubscriptionState": Case(
        "offset-store",
        _CLUSTER_ACTION,
        _o(
            "DeleteSubscriptionState",
            lambda n: offset_store_pb2.DeleteSubscriptionStateRequest(topic="guarded", subscription="none"),
        ),
    ),
    # dispatcher
    "/sluice.v1.Dispatcher/Consume": Case("dispatcher", ((R, TOPIC), (R, SUB)), consume),
    "/sluice.v1.Dispatcher/ListSubscriptions": Case("dispatcher", ((D, SUB), (D, TOPIC)), list_subscriptions),
    "/sluice.v1.Dispatcher/DescribeSubscription": Case(
        "dispatcher",
        ((D, SUB), (D, TOPIC)),
        _d(
            "DescribeSubscription",
            lambda n: dispatcher_pb2.DescribeSubscriptionRequest(topic="guarded", subscription=n),
        ),
    ),
    "/sluice.v1.Dispatcher/ResetSubscription": Case(
        "dispatcher",
        ((Operation.ALTER, SUB), (D, TOPIC)),
        _d(
            "ResetSubscription",
            lambda n: dispatcher_pb2.ResetSubscriptionRequest(
                topic="guarded", subscription=n, spec=offset_store_pb2.RESET_SPEC_EARLIEST
            ),
        ),
    ),
    "/sluice.v1.Dispatcher/SkipSubscription": Case(
        "dispatcher",
        ((Operation.ALTER, SUB), (D, TOPIC)),
        _d(
            "SkipSubscription",
            lambda n: dispatcher_pb2.SkipSubscriptionRequest(topic="guarded", subscription=n, count=1),
        ),
    ),
    "/sluice.v1.Dispatcher/DeleteSubscription": Case(
        "dispatcher",
        ((Operation.DELETE, SUB), (D, TOPIC)),
        _d(
            "DeleteSubscription",
            lambda n: dispatcher_pb2.DeleteSubscriptionRequest(topic="guarded", subscription=n),
        ),
        name="nosuchsub",
    ),
    "/sluice.v1.Dispatcher/PeekSubscription": Case(
        "dispatcher",
        ((R, SUB), (R, TOPIC)),
        _d(
            "PeekSubscription",
            lambda n: dispatcher_pb2.PeekSubscriptionRequest(topic="guarded", subscription=n, count=1),
        ),
    ),
    "/sluice.v1.Dispatcher/ListParkedKeys": Case(
        "dispatcher",
        ((D, SUB), (D, TOPIC)),
        _d(
            "ListParkedKeys",
            lambda n: dispatcher_pb2.ListParkedKeysRequest(topic="guarded", subscription=n),
        ),
    ),
    "/sluice.v1.Dispatcher/UnparkKey": Case(
        "dispatcher",
        ((Operation.ALTER, SUB),),
        _d(
            "UnparkKey",
            lambda n: dispatcher_pb2.UnparkKeyRequest(topic="guarded", subscription=n, key=b"k"),
        ),
    ),
    # ACLs and users (the coordinator)
    "/sluice.v1.Acls/CreateAcls": Case(
        "coordinator",
        ((Operation.ALTER, CLUSTER),),
        _a("CreateAcls", acl_pb2.CreateAclsRequest(acls=[acl_pb2.AclEntry()])),
    ),
    "/sluice.v1.Acls/DeleteAcls": Case(
        "coordinator",
        ((Operation.ALTER, CLUSTER),),
        _a("DeleteAcls", acl_pb2.DeleteAclsRequest(filters=[acl_pb2.AclFilter(principal="nobody-at-all")])),
    ),
    "/sluice.v1.Acls/DescribeAcls": Case(
        "coordinator", ((D, CLUSTER),), _a("DescribeAcls", acl_pb2.DescribeAclsRequest())
    ),
    "/sluice.v1.Acls/WatchSecurity": Case(
        "coordinator",
        _CLUSTER_ACTION,
        _a("WatchSecurity", acl_pb2.WatchSecurityRequest(known_version=0, max_wait_ms=0)),
    ),
    # client quotas (the coordinator)
    "/sluice.v1.Quotas/AlterQuotas": Case(
        "coordinator",
        ((Operation.ALTER, CLUSTER),),
        _q(
            "AlterQuotas",
            quota_pb2.AlterQuotasRequest(
                quotas=[
                    quota_pb2.Quota(
                        entity=quota_pb2.QuotaEntity(kind="client", name="guarded"),
                        limits=quota_pb2.QuotaLimits(requests_per_second=1e9),
                    )
                ]
            ),
        ),
    ),
    "/sluice.v1.Quotas/DeleteQuotas": Case(
        "coordinator",
        ((Operation.ALTER, CLUSTER),),
        _q(
            "DeleteQuotas",
            quota_pb2.DeleteQuotasRequest(
                entities=[quota_pb2.QuotaEntity(kind="client", name="nobody-at-all")]
            ),
        ),
    ),
    "/sluice.v1.Quotas/DescribeQuotas": Case(
        "coordinator", ((D, CLUSTER),), _q("DescribeQuotas", quota_pb2.DescribeQuotasRequest())
    ),
    "/sluice.v1.Quotas/WatchQuotas": Case(
        "coordinator",
        _CLUSTER_ACTION,
        _q("WatchQuotas", quota_pb2.WatchQuotasRequest(known_version=0, max_wait_ms=0)),
    ),
    "/sluice.v1.Auth/Authenticate": Case("coordinator", (), authenticate),
    "/sluice.v1.Auth/UpsertUser": Case(
        "coordinator", ((Operation.ALTER, CLUSTER),), _u("UpsertUser", auth_pb2.UpsertUserRequest(name="x"))
    ),
    "/sluice.v1.Auth/DeleteUser": Case(
        "coordinator",
        ((Operation.ALTER, CLUSTER),),
        _u("DeleteUser", auth_pb2.DeleteUserRequest(name="nobody-at-all")),
    ),
    "/sluice.v1.Auth/ListUsers": Case(
        "coordinator", ((D, CLUSTER),), _u("ListUsers", auth_pb2.ListUsersRequest())
    ),
    # health: open on every service
    "/grpc.health.v1.Health/Check": Case("broker", (), health_check),
    "/grpc.health.v1.Health/List": Case("broker", (), health_list),
    "/grpc.health.v1.Health/Watch": Case("broker", (), health_watch),
}
