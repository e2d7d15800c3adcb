"""Every RPC is guarded, by the right check (issue 15's first must-show).

The RPCs are enumerated from the proto descriptors of every service Sluice serves, not listed by hand:
a new RPC without a case here fails ``test_every_rpc_has_a_guard_and_a_case``, and one whose guard asks
the wrong operation fails the calls below. ``guard_cases.py`` says, independently of the guard table in
the code, what each call needs. Against a real cluster with authentication and ACLs on, each RPC is
called:

- without credentials: ``UNAUTHENTICATED`` (open RPCs: answered);
- as a principal holding every ACL except one it needs (one principal per need): ``PERMISSION_DENIED``;
- as a principal whose ACL for one need names another literal name, and one outside a prefixed ACL:
  ``PERMISSION_DENIED``;
- as a principal holding exactly what it needs: not refused.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2

from sluice import Client
from sluice.errors import AuthenticationError, AuthorizationError
from sluice.security.guards import GUARDS
from sluice.security.model import IMPLIED, Operation, ResourceType
from sluice.v1 import (
    acl_pb2,
    acl_pb2_grpc,
    auth_pb2,
    broker_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    dispatcher_pb2,
    dispatcher_pb2_grpc,
    offset_store_pb2,
    quota_pb2,
)

from .guard_cases import CASES, Case, Need
from .secure_cluster import SecureCluster, run_secure_cluster

UNAUTHENTICATED, PERMISSION_DENIED = 19, 100
REFUSED = {UNAUTHENTICATED, PERMISSION_DENIED}
MODULES = (
    broker_pb2,
    coordinator_pb2,
    offset_store_pb2,
    dispatcher_pb2,
    acl_pb2,
    auth_pb2,
    health_pb2,
    quota_pb2,
)


def descriptor_methods() -> set[str]:
    return {
        f"/{service.full_name}/{method.name}"
        for module in MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def slug(method: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", method.lower()).strip("-")


def resource_name(case: Case, need: Need) -> str:
    """The name the call gives the resource of ``need``: the case's own name for its main resource,
    the shared topic "guarded" for the topic a subscription or group call also names."""
    if need[1] is ResourceType.CLUSTER:
        return "*"
    main = case.needs[0][1]
    return case.name if need[1] is main else "guarded"


def named(case: Case) -> bool:
    """Whether the call names its resources (the literal and prefix cases apply)."""
    return case.names_resource and all(t is not ResourceType.CLUSTER for _, t in case.needs)


def grants(op: Operation, needed: Operation) -> bool:
    return op is needed or needed in IMPLIED.get(op, frozenset())


def entry(
    principal: str, op: Operation, rtype: ResourceType, name: str, prefixed: bool = False
) -> acl_pb2.AclEntry:
    return acl_pb2.AclEntry(
        principal=principal,
        resource_type=rtype.value,
        pattern="prefixed" if prefixed else "literal",
        name=name,
        operation=op.value,
        permission="allow",
    )


def acl_plan() -> list[acl_pb2.AclEntry]:
    """The ACLs of every principal the test uses (see the module docstring)."""
    out: list[acl_pb2.AclEntry] = []
    for method, case in CASES.items():
        if not case.needs:
            continue
        s = slug(method)
        exact = [(op, t, resource_name(case, (op, t))) for op, t in case.needs]
        out += [entry(f"exact-{s}", op, t, n) for op, t, n in exact]
        for i, (need_op, need_type) in enumerate(case.needs):
            deny = f"deny{i}-{s}"
            out += [entry(deny, op, t, n) for j, (op, t, n) in enumerate(exact) if j != i]
            out += [
                entry(deny, op, t, "*")
                for t in ResourceType
                for op in Operation
                if not (t is need_type and grants(op, need_op))
            ]
            if named(case):
                others = [entry(f"lit{i}-{s}", op, t, n) for j, (op, t, n) in enumerate(exact) if j != i]
                out += [*others, entry(f"lit{i}-{s}", need_op, need_type, exact[i][2][:-1])]
                others = [entry(f"pre{i}-{s}", op, t, n) for j, (op, t, n) in enumerate(exact) if j != i]
                out += [*others, entry(f"pre{i}-{s}", need_op, need_type, exact[i][2] + "x", prefixed=True)]
    return out


@pytest.fixture(scope="module")
def cluster() -> Iterator[SecureCluster]:
    with run_secure_cluster() as c:
        admin = c.admin_metadata()
        with grpc.insecure_channel(c.bootstrap) as ch:
            coord = coordinator_pb2_grpc.CoordinatorStub(ch)
            for topic in ("guarded", "doomed"):
                coord.CreateTopic(
                    coordinator_pb2.CreateTopicRequest(name=topic, partitions=1), metadata=admin, timeout=10
                )
            join = coordinator_pb2.GroupHeartbeatRequest(
                group="guarded", member_epoch=0, subscription={"guarded": ""}
            )
            joined = coord.Heartbeat(join, metadata=admin, timeout=10)
            leave = coordinator_pb2.LeaveGroupRequest(
                group="guarded", member_id=joined.member_id, member_epoch=-1
            )
            coord.LeaveGroup(leave, metadata=admin, timeout=10)
            acls = acl_pb2_grpc.AclsStub(ch)
            plan, version = acl_plan(), 0
            for start in range(0, len(plan), 1000):
                answer = acls.CreateAcls(
                    acl_pb2.CreateAclsRequest(acls=plan[start : start + 1000]), metadata=admin, timeout=30
                )
                version = answer.version
        with grpc.insecure_channel(c.dispatcher.address) as ch:
            _subscribe_once(ch, admin)
        c.wait_for_security_version(version)
        yield c


def _subscribe_once(ch: grpc.Channel, md: tuple[tuple[str, str], ...]) -> None:
    """Make the durable subscription "guarded" on topic "guarded" exist (the list cases look for it)."""
    stub = dispatcher_pb2_grpc.DispatcherStub(ch)
    cmd = dispatcher_pb2.ConsumerCommand(
        subscribe=dispatcher_pb2.Subscribe(
            topic="guarded", subscription="guarded", consumer_name="setup", durable=True
        )
    )
    call = stub.Consume(iter([cmd]), metadata=md, timeout=10)
    event = next(iter(call))
    assert not event.HasField("error"), event
    call.cancel()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        listed = stub.ListSubscriptions(
            dispatcher_pb2.ListSubscriptionsRequest(topic="guarded"), metadata=md, timeout=10
        )
        if any(s.subscription == "guarded" for s in listed.subscriptions):
            return
        time.sleep(0.05)
    raise AssertionError("the subscription did not appear")


def channel_to(c: SecureCluster, service: str) -> grpc.Channel:
    address = {
        "broker": c.broker,
        "coordinator": c.coordinator,
        "offset-store": c.offset_store,
        "dispatcher": c.dispatcher,
    }
    return grpc.insecure_channel(address[service].address)


def test_every_rpc_has_a_guard_and_a_case() -> None:
    methods = descriptor_methods()
    assert methods - set(GUARDS) == set(), "RPCs with no guard in sluice/security/guards.py"
    assert set(GUARDS) - methods == set(), "guards for RPCs that do not exist"
    assert methods - set(CASES) == set(), "RPCs with no case in guard_cases.py"


@pytest.mark.parametrize("method", sorted(CASES))
def test_each_rpc_refuses_the_unauthenticated_and_the_unauthorized(
    cluster: SecureCluster, method: str
) -> None:
    case = CASES[method]
    s = slug(method)
    with channel_to(cluster, case.service) as ch:
        anonymous = case.call(ch, (), case.name)
        if not case.needs:
            assert anonymous not in REFUSED, (
                f"{method} is open, yet refused an anonymous caller ({anonymous})"
            )
            return
        assert anonymous == UNAUTHENTICATED, f"{method} answered an anonymous caller with {anonymous}"
        exact = case.call(ch, cluster.metadata(f"exact-{s}"), case.name)
        assert exact not in REFUSED, f"{method} refused a caller holding exactly {case.needs} ({exact})"
        for i, need in enumerate(case.needs):
            denied = case.call(ch, cluster.metadata(f"deny{i}-{s}"), case.name)
            assert denied == PERMISSION_DENIED, f"{method} let a caller without {need} through ({denied})"
            if named(case):
                literal = case.call(ch, cluster.metadata(f"lit{i}-{s}"), case.name)
                assert literal == PERMISSION_DENIED, (
                    f"{method}: a literal ACL on another name let {need} through"
                )
                prefixed = case.call(ch, cluster.metadata(f"pre{i}-{s}"), case.name)
                assert prefixed == PERMISSION_DENIED, (
                    f"{method}: a prefixed ACL not matching let {need} through"
                )


# ---- the wire protocol's operations: the same cores, so the same guards ---------------------------


def _wire_produce(c: SecureCluster, principal: str | None) -> None:
    token = c.token(principal) if principal else None
    with (
        Client(c.bootstrap, token=token, request_timeout=5) as client,
        client.producer("guarded", acks=1, enable_idempotence=False, retries=0) as producer,
    ):
        producer.send(b"over the wire").result(timeout=10)


def _wire_fetch(c: SecureCluster, principal: str | None) -> None:
    token = c.token(principal) if principal else None
    with (
        Client(c.bootstrap, token=token, request_timeout=5) as client,
        client.fetcher({("guarded", 0): 0}) as f,
    ):
        f.fetch(timeout=3)


def _wire_consume(c: SecureCluster, principal: str | None) -> None:
    token = c.token(principal) if principal else None
    with Client(c.bootstrap, token=token, request_timeout=5) as client:
        client.push_consumer("guarded", "guarded").close()


WIRE_CALLS = {
    "PRODUCE": ("/sluice.v1.Broker/Produce", _wire_produce),
    "FETCH": ("/sluice.v1.Broker/Fetch", _wire_fetch),
    "CONSUME": ("/sluice.v1.Dispatcher/Consume", _wire_consume),
}


@pytest.mark.parametrize("operation", sorted(WIRE_CALLS))
def test_each_wire_operation_has_the_guard_of_its_grpc_twin(cluster: SecureCluster, operation: str) -> None:
    """The SDK's records travel on the wire protocol (its default transport): a produce, a fetch and a
    push subscription are refused without credentials, refused without the right the gRPC twin needs
    (the principal holding every other ACL), and served with exactly that right."""
    method, call = WIRE_CALLS[operation]
    case = CASES[method]
    s = slug(method)
    with pytest.raises(AuthenticationError):
        call(cluster, None)
    for i in range(len(case.needs)):  # one principal per need, holding every other ACL
        with pytest.raises(AuthorizationError):
            call(cluster, f"deny{i}-{s}")
    call(cluster, f"exact-{s}")
