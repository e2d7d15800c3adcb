"""The attacks of issue 15, as a new user would try them with the SDK and raw gRPC: all refused.

Against a real cluster with authentication and ACLs on (``secure_cluster.py``):

- anonymous consume, produce, topic deletion and offset reset;
- ``Broker.UpdatePartitions`` with ``metadata_version=1e15`` and a ``remove`` entry (which would wipe a
  partition), anonymously and as a user holding every right on every topic: the data is still there;
- ``Coordinator.RegisterBroker`` impersonating a broker;
- token attacks at a service: ``alg: none``, HS256 signed with the RSA public key, expired, wrong
  audience, wrong issuer;
- a consumer whose read ACL is removed mid-stream: its stream ends, another consumer's goes on;
- a stream that outlives its token is ended;
- a delayed record aimed, through the schedule topic, at a topic its writer may not write.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from sluice import Client
from sluice.client.fetcher import Fetcher
from sluice.client.producer.delay import DUE_HEADER, SCHEDULE_TOPIC, TARGET_HEADER, TARGET_PARTITION_HEADER
from sluice.codec.batch import BatchBuilder
from sluice.common.rpc import error_from_rpc
from sluice.errors import AuthenticationError, AuthorizationError, CredentialsExpired, SluiceError
from sluice.v1 import (
    acl_pb2,
    acl_pb2_grpc,
    broker_pb2,
    broker_pb2_grpc,
    coordinator_pb2,
    coordinator_pb2_grpc,
)
from tests.harness import ServiceProcess

from .secure_cluster import ISSUER, SecureCluster, run_secure_cluster

TOPIC = "attacked"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SecureCluster]:
    with run_secure_cluster() as c:
        with Client(c.bootstrap, token=c.token("admin")) as admin:
            admin.admin.create_topic(TOPIC, partitions=1)
            admin.admin.create_topic("live", partitions=1)
            admin.admin.create_topic("other", partitions=1)
            with admin.producer(TOPIC) as producer:
                for i in range(10):
                    producer.send(f"r{i}".encode())
        yield c


def grant(c: SecureCluster, *entries: acl_pb2.AclEntry) -> None:
    with grpc.insecure_channel(c.bootstrap) as ch:
        answer = acl_pb2_grpc.AclsStub(ch).CreateAcls(
            acl_pb2.CreateAclsRequest(acls=list(entries)), metadata=c.admin_metadata(), timeout=10
        )
    c.wait_for_security_version(answer.version)


def revoke(c: SecureCluster, principal: str) -> None:
    with grpc.insecure_channel(c.bootstrap) as ch:
        answer = acl_pb2_grpc.AclsStub(ch).DeleteAcls(
            acl_pb2.DeleteAclsRequest(filters=[acl_pb2.AclFilter(principal=principal)]),
            metadata=c.admin_metadata(),
            timeout=10,
        )
    c.wait_for_security_version(answer.version)


def allow(principal: str, rtype: str, name: str, operation: str) -> acl_pb2.AclEntry:
    return acl_pb2.AclEntry(
        principal=principal,
        resource_type=rtype,
        pattern="literal",
        name=name,
        operation=operation,
        permission="allow",
    )


def records_of(c: SecureCluster, topic: str) -> list[bytes]:
    with Client(c.bootstrap, token=c.token("admin")) as admin, admin.fetcher({(topic, 0): 0}) as fetcher:
        out: list[bytes] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            batch = fetcher.fetch(timeout=1)
            out += [r.value for r in batch]
            if not batch:
                return out
        return out


# ---- anonymous --------------------------------------------------------------------------------------------


def test_anonymous_consume_produce_delete_and_reset_are_refused(cluster: SecureCluster) -> None:
    with Client(cluster.bootstrap, request_timeout=5) as anonymous:
        with pytest.raises(AuthenticationError):
            anonymous.metadata([TOPIC])
        with pytest.raises(AuthenticationError):
            anonymous.producer(TOPIC)
        with pytest.raises(AuthenticationError):
            anonymous.fetcher({(TOPIC, 0): 0}).fetch(timeout=5)
        with pytest.raises(AuthenticationError):
            anonymous.consumer("thieves", [TOPIC])
        with pytest.raises(AuthenticationError):
            anonymous.admin.delete_topic(TOPIC)
        with pytest.raises(AuthenticationError):
            anonymous.admin.reset_offsets("victims", TOPIC, "earliest")
    assert records_of(cluster, TOPIC)[:10] == [f"r{i}".encode() for i in range(10)]


# ---- the UpdatePartitions wipe and broker impersonation -------------------------------------------


def _wipe(cluster: SecureCluster, md: tuple[tuple[str, str], ...]) -> SluiceError:
    gone = broker_pb2.PartitionAssignment(topic=TOPIC, partition=0)
    request = broker_pb2.UpdatePartitionsRequest(metadata_version=10**15, remove=[gone])
    with grpc.insecure_channel(cluster.broker.address) as ch, pytest.raises(grpc.RpcError) as refused:
        broker_pb2_grpc.BrokerStub(ch).UpdatePartitions(request, metadata=md, timeout=10)
    return error_from_rpc(refused.value)


def test_the_update_partitions_wipe_is_refused_and_the_data_stays(cluster: SecureCluster) -> None:
    assert isinstance(_wipe(cluster, ()), AuthenticationError)
    everything = [allow("mallory", "topic", "*", op) for op in ("all",)]
    grant(cluster, *everything)
    assert isinstance(_wipe(cluster, cluster.metadata("mallory")), AuthorizationError)
    assert records_of(cluster, TOPIC)[:10] == [f"r{i}".encode() for i in range(10)]


def test_a_user_cannot_register_as_a_broker(cluster: SecureCluster) -> None:
    fake = coordinator_pb2.RegisterBrokerRequest(
        broker_id=1,
        endpoint=coordinator_pb2.Endpoint(host="203.0.113.9", port=1, wire_port=2),
        incarnation="evil",
    )
    with grpc.insecure_channel(cluster.bootstrap) as ch:
        stub = coordinator_pb2_grpc.CoordinatorStub(ch)
        for md, expected in (((), AuthenticationError), (cluster.metadata("mallory"), AuthorizationError)):
            with pytest.raises(grpc.RpcError) as refused:
                stub.RegisterBroker(fake, metadata=md, timeout=10)
            assert isinstance(error_from_rpc(refused.value), expected)
        brokers = stub.Metadata(
            coordinator_pb2.MetadataRequest(), metadata=cluster.admin_metadata(), timeout=10
        ).brokers
    assert [b.endpoint.host for b in brokers] == ["127.0.0.1"]


# ---- tokens ---------------------------------------------------------------------------------------------


def _b64(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


def _claims(**over: object) -> dict[str, object]:
    now = int(time.time())
    return {"iss": ISSUER, "aud": "sluice", "sub": "admin", "iat": now, "exp": now + 600, **over}


def forged_tokens(cluster: SecureCluster) -> dict[str, str]:
    public_pem = cluster.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return {
        "alg none": f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(_claims())}.",
        "HS256 with the RSA public key": _hs256(_claims(), public_pem),
        "expired": jwt.encode(_claims(exp=int(time.time()) - 3600), cluster.key, algorithm="RS256"),
        "wrong audience": jwt.encode(_claims(aud="someone-else"), cluster.key, algorithm="RS256"),
        "wrong issuer": jwt.encode(_claims(iss="https://evil.example"), cluster.key, algorithm="RS256"),
    }


def _hs256(claims: dict[str, object], secret: bytes) -> str:
    import hashlib
    import hmac

    head = f"{_b64({'alg': 'HS256', 'typ': 'JWT'})}.{_b64(claims)}"
    sig = hmac.new(secret, head.encode(), hashlib.sha256).digest()
    return head + "." + base64.urlsafe_b64encode(sig).rstrip(b"=").decode()


def test_forged_and_stale_tokens_are_refused_by_the_services(cluster: SecureCluster) -> None:
    for what, token in forged_tokens(cluster).items():
        md = (("authorization", f"Bearer {token}"),)
        with grpc.insecure_channel(cluster.bootstrap) as ch, pytest.raises(grpc.RpcError) as refused:
            coordinator_pb2_grpc.CoordinatorStub(ch).Metadata(
                coordinator_pb2.MetadataRequest(), metadata=md, timeout=10
            )
        assert isinstance(error_from_rpc(refused.value), AuthenticationError), what
        with (
            Client(cluster.bootstrap, token=token, request_timeout=5) as forger,
            pytest.raises(AuthenticationError),
        ):
            forger.producer(TOPIC)


# ---- live streams -------------------------------------------------------------------------------------


def test_a_consumer_whose_read_acl_is_removed_is_cut_off_while_another_goes_on(
    cluster: SecureCluster,
) -> None:
    grant(
        cluster,
        allow("reader", "topic", "live", "read"),
        allow("bystander", "topic", "other", "read"),
    )
    with (
        Client(cluster.bootstrap, token=cluster.token("admin")) as admin,
        Client(cluster.bootstrap, token=cluster.token("reader")) as reader_client,
        Client(cluster.bootstrap, token=cluster.token("bystander")) as bystander_client,
        reader_client.fetcher({("live", 0): 0}) as reader,
        bystander_client.fetcher({("other", 0): 0}) as bystander,
    ):
        with admin.producer("live") as p, admin.producer("other") as q:
            p.send(b"before")
            q.send(b"before")
        assert [r.value for r in reader.fetch(timeout=10)] == [b"before"]
        assert [r.value for r in bystander.fetch(timeout=10)] == [b"before"]
        revoke(cluster, "reader")
        with admin.producer("live") as p, admin.producer("other") as q:
            p.send(b"after")
            q.send(b"after")
        with pytest.raises(AuthorizationError):
            _fetch_until_refused(reader)
        assert [r.value for r in bystander.fetch(timeout=10)] == [b"after"]


def _fetch_until_refused(fetcher: Fetcher) -> None:
    """Fetch (10 s at most) until the fetcher raises; a record written after the revocation must not
    arrive meanwhile."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert b"after" not in [r.value for r in fetcher.fetch(timeout=1)]


def test_a_stream_that_outlives_its_token_is_ended(cluster: SecureCluster) -> None:
    grant(cluster, allow("shortlived", "topic", "live", "read"))
    request = broker_pb2.FetchRequest(
        max_wait_ms=500, max_bytes=1 << 20, partitions=[broker_pb2.FetchPartition(topic="live", partition=0)]
    )
    md = (("authorization", f"Bearer {cluster.token('shortlived', ttl_s=2)}"),)

    def requests() -> Iterator[broker_pb2.FetchRequest]:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            yield request
            time.sleep(0.2)

    started = time.monotonic()
    with grpc.insecure_channel(cluster.broker.address) as ch, pytest.raises(grpc.RpcError) as ended:
        for _answer in broker_pb2_grpc.BrokerStub(ch).FetchStream(requests(), metadata=md, timeout=30):
            pass
    assert isinstance(error_from_rpc(ended.value), CredentialsExpired)  # retriable: reconnect
    assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert time.monotonic() - started < 15


# ---- auditing -----------------------------------------------------------------------------------------


def _audit_lines(sp: ServiceProcess) -> list[dict[str, object]]:
    lines = []
    for line in sp.log().splitlines():
        start = line.find('{"event"')
        if "sluice.audit" in line and start >= 0:
            lines.append(json.loads(line[start:]))
    return lines


def test_denials_refusals_and_security_changes_are_audited(cluster: SecureCluster) -> None:
    with Client(cluster.bootstrap, token=cluster.token("admin")) as admin:
        admin.admin.create_topic("audited", partitions=1)
        admin.admin.delete_topic("audited")
    nobody = Client(cluster.bootstrap, token=cluster.token("nobody"), request_timeout=5)
    with nobody, pytest.raises(AuthorizationError):
        nobody.admin.delete_topic(TOPIC)
    with Client(cluster.bootstrap, request_timeout=5) as anonymous, pytest.raises(AuthenticationError):
        anonymous.metadata()
    lines = _audit_lines(cluster.coordinator)
    assert {"event": "change", "principal": "admin", "action": "topic.delete"}.items() <= next(
        line for line in lines if line.get("action") == "topic.delete"
    ).items()
    denied = [line for line in lines if line["event"] == "denied" and line["principal"] == "nobody"]
    assert denied
    assert denied[0]["operation"] == "delete"
    assert denied[0]["resource"] == TOPIC
    assert any(line["event"] == "unauthenticated" for line in lines)


# ---- several topics in one request, and a later message on a stream ------------------------------------


def _produce_request(*topics: str) -> broker_pb2.ProduceRequest:
    b = BatchBuilder()
    b.append(b"v", None, None, None, 1_000)
    records = b.build()
    parts = [broker_pb2.ProducePartition(topic=t, partition=0, records=records) for t in topics]
    return broker_pb2.ProduceRequest(acks=1, timeout_ms=5000, partitions=parts)


def _codes(answer: broker_pb2.ProduceResponse) -> dict[str, int]:
    return {p.topic: int(p.error.code) for p in answer.partitions}


def test_the_unauthorized_part_of_a_request_is_denied_and_a_later_stream_message_too(
    cluster: SecureCluster,
) -> None:
    grant(cluster, allow("writer", "topic", "live", "write"))
    md = cluster.metadata("writer")
    with grpc.insecure_channel(cluster.broker.address) as ch:
        stub = broker_pb2_grpc.BrokerStub(ch)
        mixed = stub.Produce(_produce_request("live", "other"), metadata=md, timeout=10)
        assert _codes(mixed) == {"live": 0, "other": 100}  # written, PERMISSION_DENIED
        requests = iter([_produce_request("live"), _produce_request("other"), _produce_request("live")])
        answers = [_codes(a) for a in stub.ProduceStream(requests, metadata=md, timeout=10)]
    assert answers == [{"live": 0}, {"other": 100}, {"live": 0}]


def _schedule_request(*targets: str) -> broker_pb2.ProduceRequest:
    """A schedule-topic batch whose records will be delivered to ``targets`` (the SDK's envelope)."""
    b = BatchBuilder()
    for target in targets:
        envelope = {DUE_HEADER: b"1", TARGET_HEADER: target.encode(), TARGET_PARTITION_HEADER: b"0"}
        b.append(b"v", None, None, envelope, 1_000)
    part = broker_pb2.ProducePartition(topic=SCHEDULE_TOPIC, partition=0, records=b.build())
    return broker_pb2.ProduceRequest(acks=1, timeout_ms=5000, partitions=[part])


def test_a_delayed_record_is_authorized_against_the_topic_it_will_be_delivered_to(
    cluster: SecureCluster,
) -> None:
    """The scheduler delivers with its own identity, so writing the schedule topic must not be a way
    into a topic the writer may not write: the broker authorizes each record's target at produce time."""
    with Client(cluster.bootstrap, token=cluster.token("admin")) as admin:
        admin.admin.create_topic(SCHEDULE_TOPIC, partitions=1)
    grant(
        cluster,
        allow("delayer", "topic", SCHEDULE_TOPIC, "write"),
        allow("delayer", "topic", "live", "write"),
    )
    md = cluster.metadata("delayer")
    with grpc.insecure_channel(cluster.broker.address) as ch:
        stub = broker_pb2_grpc.BrokerStub(ch)
        assert _codes(stub.Produce(_schedule_request("other"), metadata=md, timeout=10)) == {
            SCHEDULE_TOPIC: 100
        }
        # One forbidden target refuses the whole batch (a batch is appended whole or not at all).
        mixed = stub.Produce(_schedule_request("live", "other"), metadata=md, timeout=10)
        assert _codes(mixed) == {SCHEDULE_TOPIC: 100}
        assert _codes(stub.Produce(_schedule_request("live"), metadata=md, timeout=10)) == {SCHEDULE_TOPIC: 0}
    assert len(records_of(cluster, SCHEDULE_TOPIC)) == 1  # only the allowed one was stored
