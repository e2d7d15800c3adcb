"""One cluster for the fuzz suite (coordinator, broker, offset store, dispatcher over a private
redis-server; no authentication), with the names of ``messages.KNOWN_NAMES`` made real, and a check
after every test that each process still answers its health check SERVING, never logged a
traceback, and counted no internal error (``sluice_internal_errors_total`` is 0: bad input is a typed
error, never INTERNAL)."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.v1 import coordinator_pb2, coordinator_pb2_grpc, dispatcher_pb2, dispatcher_pb2_grpc
from tests.harness import ServiceProcess
from tests.integration.push.conftest import PushCluster, run_push_cluster


def processes(cluster: PushCluster) -> dict[str, ServiceProcess]:
    return {
        "coordinator": cluster.coordinator,
        "broker": cluster.broker,
        "offset-store": cluster.offset_store,
        "dispatcher": cluster.dispatcher,
    }


def internal_errors(sp: ServiceProcess) -> dict[str, float]:
    """The process's ``sluice_internal_errors_total`` series, by their labels, from its /metrics."""
    with urllib.request.urlopen(f"http://{sp.metrics}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    series = {}
    for line in text.splitlines():
        if line.startswith("sluice_internal_errors_total{"):
            labels, value = line.rsplit(" ", 1)
            series[labels] = float(value)
    return series


def assert_healthy(cluster: PushCluster) -> None:
    for name, sp in processes(cluster).items():
        assert sp.process.poll() is None, f"the {name} exited:\n{sp.log()[-4000:]}"
        with grpc.insecure_channel(sp.address) as ch:
            answer = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, (name, answer)
        log = sp.log()
        assert "Traceback" not in log, (
            f"the {name} logged a traceback:\n{log[log.index('Traceback') - 300 :][:4000]}"
        )
        counted = {labels: n for labels, n in internal_errors(sp).items() if n}
        assert not counted, f"the {name} counted internal errors: {counted}"


def seed(cluster: PushCluster) -> None:
    """Make the topic, group and subscription that fuzzed requests name (messages.KNOWN_NAMES)."""
    with grpc.insecure_channel(cluster.bootstrap) as ch:
        coord = coordinator_pb2_grpc.CoordinatorStub(ch)
        coord.CreateTopic(coordinator_pb2.CreateTopicRequest(name="fuzz", partitions=2), timeout=10)
        join = coordinator_pb2.GroupHeartbeatRequest(
            group="fuzz-group", member_epoch=0, subscription={"fuzz": ""}
        )
        coord.Heartbeat(join, timeout=10)
    with grpc.insecure_channel(cluster.dispatcher.address) as ch:
        subscribe = dispatcher_pb2.Subscribe(topic="fuzz", subscription="fuzz-sub", consumer_name="seed")
        stream = dispatcher_pb2_grpc.DispatcherStub(ch).Consume(
            iter([dispatcher_pb2.ConsumerCommand(subscribe=subscribe)]), timeout=10
        )
        first = next(iter(stream))
        assert not first.HasField("error"), first
        stream.cancel()


@pytest.fixture(scope="package")
def cluster() -> Iterator[PushCluster]:
    with run_push_cluster() as c:
        seed(c)
        yield c


@pytest.fixture
def healthy_after(cluster: PushCluster) -> Iterator[PushCluster]:
    """The cluster, checked healthy (and traceback-free) after the test."""
    yield cluster
    assert_healthy(cluster)
