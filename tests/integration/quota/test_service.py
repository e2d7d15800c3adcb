"""The coordinator's Quotas service over gRPC: typed errors for bad input, and the long poll."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from sluice.v1 import quota_pb2 as pb
from sluice.v1 import quota_pb2_grpc

from .conftest import QuotaCluster


@pytest.fixture
def stub(cluster: QuotaCluster) -> quota_pb2_grpc.QuotasStub:
    return quota_pb2_grpc.QuotasStub(grpc.insecure_channel(cluster.coordinator.address))


def _quota(kind: str, name: str, **limits: float) -> pb.Quota:
    quota = pb.Quota(entity=pb.QuotaEntity(kind=kind, name=name))
    for field, value in limits.items():
        setattr(quota.limits, field, value)
    return quota


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (pb.AlterQuotasRequest(), "no quotas given"),
        (pb.AlterQuotasRequest(quotas=[_quota("group", "x", requests_per_second=1)]), "user, client"),
        (
            pb.AlterQuotasRequest(quotas=[_quota("client", "x" * 100_000, requests_per_second=1)]),
            "at most 256",
        ),
        (pb.AlterQuotasRequest(quotas=[_quota("client", "x", requests_per_second=float("nan"))]), ">= 0"),
        (pb.AlterQuotasRequest(quotas=[_quota("client", "x", subscribes_per_second=-1)]), ">= 0"),
    ],
)
def test_bad_input_is_invalid_argument(
    stub: quota_pb2_grpc.QuotasStub, request_: pb.AlterQuotasRequest, needle: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.AlterQuotas(request_, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert needle in (err.value.details() or "")
    assert len(err.value.details() or "") < 1000


def test_describe_with_a_bad_kind(stub: quota_pb2_grpc.QuotasStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.DescribeQuotas(pb.DescribeQuotasRequest(kind="nope"), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_waiting_poll_answers_at_the_change(stub: quota_pb2_grpc.QuotasStub) -> None:
    version = stub.WatchQuotas(pb.WatchQuotasRequest(known_version=0, max_wait_ms=0), timeout=30).version
    answers: list[pb.WatchQuotasResponse] = []
    poll = threading.Thread(
        target=lambda: answers.append(
            stub.WatchQuotas(pb.WatchQuotasRequest(known_version=version, max_wait_ms=30_000), timeout=60)
        )
    )
    started = time.monotonic()
    poll.start()
    time.sleep(0.5)  # let the poll park (its answer must come from the change, not from the timeout)
    stub.AlterQuotas(
        pb.AlterQuotasRequest(quotas=[_quota("user", "poller", requests_per_second=7)]), timeout=30
    )
    poll.join(60)
    assert answers, "the poll never answered"
    assert answers[0].changed
    assert answers[0].version > version
    assert time.monotonic() - started < 20
    got = {(q.entity.kind, q.entity.name): q.limits for q in answers[0].quotas}
    assert got[("user", "poller")].requests_per_second == 7
    deleted = stub.DeleteQuotas(
        pb.DeleteQuotasRequest(entities=[pb.QuotaEntity(kind="user", name="poller")]), timeout=30
    )
    assert deleted.deleted == 1
