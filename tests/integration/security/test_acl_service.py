"""The coordinator's Acls service: a real ``sluice coordinator`` process and a private Redis, raw gRPC.

Storage (set semantics, the version bumped exactly on changes, survival across a restart, the documented
keys), validation with typed errors, and the WatchSecurity long poll (an answer at once when behind, a wait
on an event that a change ends, "unchanged" after max_wait_ms).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import redis

from sluice.errors import InvalidArgument
from sluice.v1 import acl_pb2 as pb
from sluice.v1 import acl_pb2_grpc
from tests.harness import RedisServer, free_port, run_redis
from tests.integration.coordinator.coordinator_peers import Coordinator, run_coordinator, typed_error

PREFIX = "acltest"


def entry(principal: str = "alice", name: str = "orders", operation: str = "read", **kw: str) -> pb.AclEntry:
    fields = {"resource_type": "topic", "pattern": "literal", "permission": "allow", **kw}
    return pb.AclEntry(principal=principal, name=name, operation=operation, **fields)


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    with run_redis() as r:
        yield r


@pytest.fixture(scope="module")
def coordinator(private_redis: RedisServer) -> Iterator[Coordinator]:
    port = str(free_port())  # fixed: the restart test comes back on the same address
    args = ("--port", port, "--metrics-port", "0", "--redis-url", private_redis.url, "--key-prefix", PREFIX)
    with run_coordinator(*args) as c:
        yield c


@pytest.fixture
def stub(coordinator: Coordinator) -> Iterator[acl_pb2_grpc.AclsStub]:
    with grpc.insecure_channel(coordinator.address) as channel:
        stub = acl_pb2_grpc.AclsStub(channel)
        stub.DeleteAcls(pb.DeleteAclsRequest(filters=[pb.AclFilter()]), timeout=10)  # every test starts empty
        yield stub


def test_create_describe_delete_and_the_version(
    stub: acl_pb2_grpc.AclsStub, private_redis: RedisServer
) -> None:
    v0 = stub.DescribeAcls(pb.DescribeAclsRequest(), timeout=10).version
    created = stub.CreateAcls(
        pb.CreateAclsRequest(acls=[entry(), entry("bob", "pay", "write", pattern="prefixed")]), timeout=10
    )
    assert (created.created, created.version) == (2, v0 + 1)
    # Adding what is there changes nothing: no new version, so no service reloads for nothing.
    again = stub.CreateAcls(pb.CreateAclsRequest(acls=[entry()]), timeout=10)
    assert (again.created, again.version) == (0, v0 + 1)

    everything = stub.DescribeAcls(pb.DescribeAclsRequest(), timeout=10)
    assert everything.version == v0 + 1
    assert sorted(e.principal for e in everything.acls) == ["alice", "bob"]
    bobs = stub.DescribeAcls(pb.DescribeAclsRequest(filter=pb.AclFilter(pattern="prefixed")), timeout=10)
    assert [(e.principal, e.name, e.operation) for e in bobs.acls] == [("bob", "pay", "write")]

    # The documented keys (docs/redis-schema.md, "Security").
    r = redis.Redis.from_url(private_redis.url)
    assert int(r.get(f"{PREFIX}:security:version") or 0) == v0 + 1
    assert r.scard(f"{PREFIX}:security:acls") == 2

    gone = stub.DeleteAcls(pb.DeleteAclsRequest(filters=[pb.AclFilter(principal="alice")]), timeout=10)
    assert [e.principal for e in gone.deleted] == ["alice"]
    assert gone.version == v0 + 2
    nothing = stub.DeleteAcls(pb.DeleteAclsRequest(filters=[pb.AclFilter(principal="alice")]), timeout=10)
    assert (list(nothing.deleted), nothing.version) == ([], v0 + 2)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (pb.CreateAclsRequest(), "no acls given"),
        (pb.CreateAclsRequest(acls=[entry(resource_type="queue")]), "acls[0]: unknown resource type 'queue'"),
        (pb.CreateAclsRequest(acls=[entry(), entry(name="")]), "acls[1]: an ACL's resource name must not be"),
        (pb.CreateAclsRequest(acls=[entry(principal="")]), "principal must not be empty"),
        (pb.CreateAclsRequest(acls=[entry(pattern="glob")]), "unknown pattern type 'glob'"),
        (pb.CreateAclsRequest(acls=[entry(operation="fly")]), "unknown operation"),
        (pb.CreateAclsRequest(acls=[entry(permission="perhaps")]), "unknown permission"),
        (pb.CreateAclsRequest(acls=[entry(resource_type="cluster", name="x")]), "cluster ACL names"),
        (pb.DeleteAclsRequest(), "no filters given"),
        (pb.DeleteAclsRequest(filters=[pb.AclFilter(operation="fly")]), "filters[0]: unknown operation"),
    ],
)
def test_bad_requests_get_invalid_argument(
    stub: acl_pb2_grpc.AclsStub, request_: pb.CreateAclsRequest | pb.DeleteAclsRequest, message: str
) -> None:
    method = stub.CreateAcls if isinstance(request_, pb.CreateAclsRequest) else stub.DeleteAcls
    error, code = typed_error(method, request_)
    assert isinstance(error, InvalidArgument), error
    assert message in error.message
    assert code is not None


def test_describe_with_a_bad_filter(stub: acl_pb2_grpc.AclsStub) -> None:
    error, _ = typed_error(stub.DescribeAcls, pb.DescribeAclsRequest(filter=pb.AclFilter(resource_type="q")))
    assert isinstance(error, InvalidArgument)


def test_watch_answers_at_once_when_behind_and_waits_when_current(stub: acl_pb2_grpc.AclsStub) -> None:
    stub.CreateAcls(pb.CreateAclsRequest(acls=[entry()]), timeout=10)
    started = time.monotonic()
    behind = stub.WatchSecurity(pb.WatchSecurityRequest(known_version=0, max_wait_ms=10_000), timeout=15)
    assert time.monotonic() - started < 2
    assert behind.changed
    assert behind.snapshot.version == behind.version > 0
    assert [e.principal for e in behind.snapshot.acls] == ["alice"]
    assert dict(behind.snapshot.user_generations) == {}

    # Current: "unchanged" after max_wait_ms, not before.
    started = time.monotonic()
    same = stub.WatchSecurity(
        pb.WatchSecurityRequest(known_version=behind.version, max_wait_ms=400), timeout=10
    )
    waited = time.monotonic() - started
    assert not same.changed
    assert same.version == behind.version
    assert 0.35 <= waited < 3, waited

    # Current, then a change while waiting: the poll ends with the new snapshot at once.
    answers: list[pb.WatchSecurityResponse] = []
    poll = threading.Thread(
        target=lambda: answers.append(
            stub.WatchSecurity(
                pb.WatchSecurityRequest(known_version=behind.version, max_wait_ms=20_000), timeout=30
            )
        )
    )
    started = time.monotonic()
    poll.start()
    time.sleep(0.3)
    stub.CreateAcls(pb.CreateAclsRequest(acls=[entry("carol")]), timeout=10)
    poll.join(10)
    assert answers, "the poll did not end on the change"
    assert time.monotonic() - started < 5
    assert answers[0].changed
    assert sorted(e.principal for e in answers[0].snapshot.acls) == ["alice", "carol"]
    assert answers[0].version == behind.version + 1


def test_a_version_ahead_of_the_coordinator_gets_the_snapshot_too(stub: acl_pb2_grpc.AclsStub) -> None:
    # E.g. Redis restored from an older backup: the services must come back to what it holds.
    current = stub.DescribeAcls(pb.DescribeAclsRequest(), timeout=10).version
    answer = stub.WatchSecurity(
        pb.WatchSecurityRequest(known_version=current + 100, max_wait_ms=5000), timeout=10
    )
    assert answer.changed
    assert answer.snapshot.version == current


def test_acls_and_version_survive_a_coordinator_restart(
    stub: acl_pb2_grpc.AclsStub, coordinator: Coordinator
) -> None:
    stub.CreateAcls(pb.CreateAclsRequest(acls=[entry("dave", "x", "all", permission="deny")]), timeout=10)
    before = stub.DescribeAcls(pb.DescribeAclsRequest(), timeout=10)
    coordinator.stop(kill=True)
    coordinator.restart()
    with grpc.insecure_channel(coordinator.address) as channel:
        after = acl_pb2_grpc.AclsStub(channel).DescribeAcls(pb.DescribeAclsRequest(), timeout=10)
        assert after.version == before.version
        assert list(after.acls) == list(before.acls)
        more = acl_pb2_grpc.AclsStub(channel).CreateAcls(
            pb.CreateAclsRequest(acls=[entry("erin")]), timeout=10
        )
        assert more.version == before.version + 1  # monotonic across the restart
