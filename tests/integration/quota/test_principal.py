"""With authentication on, a quota follows the authenticated principal, whatever client id it
announces: a user over its quota is held to it, another user is not."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

import grpc

from sluice import Client
from sluice.v1 import acl_pb2, acl_pb2_grpc, quota_pb2, quota_pb2_grpc
from tests.integration.security.secure_cluster import run_secure_cluster
from tests.wire_client import wire_address

from .producers import Answers, wire_producer
from .test_throttle import QUOTA, RUN_S, WINDOW, _batch, _run


def _quota_version(metrics: str) -> float:
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    return max(
        (float(line.split()[-1]) for line in text.splitlines() if line.startswith("sluice_quota_version ")),
        default=0.0,
    )


def test_a_user_quota_follows_the_principal_not_the_client_id() -> None:
    with run_secure_cluster() as cluster, grpc.insecure_channel(cluster.bootstrap) as channel:
        admin = cluster.admin_metadata()
        topic = "quota-users"
        with Client(cluster.bootstrap, token=cluster.token("admin")) as client:
            client.admin.create_topic(topic, partitions=2)
        acls = acl_pb2_grpc.AclsStub(channel).CreateAcls(
            acl_pb2.CreateAclsRequest(
                acls=[
                    acl_pb2.AclEntry(
                        principal=who,
                        resource_type="topic",
                        pattern="literal",
                        name=topic,
                        operation="write",
                        permission="allow",
                    )
                    for who in ("alice", "bob")
                ]
            ),
            metadata=admin,
            timeout=30,
        )
        cluster.wait_for_security_version(acls.version)
        quota = quota_pb2.Quota(
            entity=quota_pb2.QuotaEntity(kind="user", name="alice"),
            limits=quota_pb2.QuotaLimits(produce_bytes_per_second=QUOTA),
        )
        version = (
            quota_pb2_grpc.QuotasStub(channel)
            .AlterQuotas(quota_pb2.AlterQuotasRequest(quotas=[quota]), metadata=admin, timeout=30)
            .version
        )
        deadline = time.monotonic() + 30
        while _quota_version(cluster.broker.metrics) < version:
            assert time.monotonic() < deadline, "the broker never got the quota"
            time.sleep(0.05)

        wire = wire_address(cluster.broker.output)
        batch = _batch()

        def as_user(user: str, client_id: str, partition: int, window: int) -> Callable[[], Answers]:
            creds = {"authorization": f"Bearer {cluster.token(user)}"}
            return lambda: wire_producer(wire, client_id, topic, partition, batch, RUN_S, window, creds)

        # Each announces the other's name as its client id: the principal decides, not the id.
        results, started = _run(
            {"alice": as_user("alice", "bob", 0, 16), "bob": as_user("bob", "alice", 1, 1)}
        )
        alice = results["alice"].rate(started + WINDOW[0], started + WINDOW[1])
        bob = results["bob"].rate(started + WINDOW[0], started + WINDOW[1])
        assert not results["alice"].errors, results["alice"].errors[:2]
        assert not results["bob"].errors, results["bob"].errors[:2]
        assert abs(alice - QUOTA) <= 0.10 * QUOTA, f"alice at {alice:.0f} B/s under a {QUOTA} B/s quota"
        assert results["bob"].throttled == 0
        assert bob > 2 * QUOTA, f"bob at {bob:.0f} B/s"
