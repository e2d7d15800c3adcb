"""The coordinator's group metrics for real (issue 5): lag in seconds, rebalances and fencing per group,
the group's rebalance timeout bounding the member's, and a coordinator that stops leading exporting no
stale group state. Real redis-server, coordinator, broker and offset-store processes; the metrics are
read from the coordinator's /metrics endpoint as Prometheus would."""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from sluice.codec.batch import BatchBuilder
from sluice.coordinator.groups.redis_ops import GroupKeys
from sluice.offsetstore.keys import partition_field
from sluice.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    offset_store_pb2,
    offset_store_pb2_grpc,
)
from tests.harness import RedisServer, ServiceProcess, run_redis, start_service

COMMON = ("--port", "0", "--metrics-port", "0")
Labels = frozenset[tuple[str, str]]


def samples(service: ServiceProcess) -> dict[tuple[str, Labels], float]:
    """Every sample of the service's /metrics: (name, labels) -> value."""
    with urllib.request.urlopen(f"http://{service.metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(service: ServiceProcess, name: str, **labels: str) -> float | None:
    return samples(service).get((name, frozenset(labels.items())))


def eventually(what: str, condition: Callable[[], bool], timeout: float = 15.0) -> None:
    """The coordinator refreshes these on its own timers: another process's metrics, no event to await."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.1)


@dataclass
class Stack:
    redis_server: RedisServer
    coordinator: ServiceProcess
    broker: ServiceProcess
    offset_store: ServiceProcess
    channels: list[grpc.Channel]

    def coordinator_stub(self) -> coordinator_pb2_grpc.CoordinatorStub:
        channel = grpc.insecure_channel(self.coordinator.address)
        self.channels.append(channel)
        return coordinator_pb2_grpc.CoordinatorStub(channel)

    def commit(
        self, group: str, member: coordinator_pb2.GroupHeartbeatResponse, topic: str, offset: int
    ) -> None:
        channel = grpc.insecure_channel(self.offset_store.address)
        self.channels.append(channel)
        request = offset_store_pb2.CommitOffsetsRequest(
            group=group,
            member_id=member.member_id,
            member_epoch=member.member_epoch,
            offsets=[offset_store_pb2.PartitionOffset(topic=topic, partition=0, offset=offset)],
        )
        result = offset_store_pb2_grpc.OffsetStoreStub(channel).CommitOffsets(request, timeout=10)
        assert result.results[0].error.code == common_pb2.NONE, result

    def produce(self, topic: str, timestamps: list[int]) -> None:
        batch = BatchBuilder()
        for i, ts in enumerate(timestamps):
            batch.append(b"v%d" % i, None, None, None, ts)
        request = broker_pb2.ProduceRequest(acks=1, timeout_ms=5000)
        request.partitions.add(topic=topic, partition=0, records=batch.build())
        channel = grpc.insecure_channel(self.broker.address)
        self.channels.append(channel)
        answer = broker_pb2_grpc.BrokerStub(channel).Produce(request, timeout=10)
        assert answer.partitions[0].error.code == common_pb2.NONE, answer


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    services: list[ServiceProcess] = []
    with run_redis() as redis_server, tempfile.TemporaryDirectory() as data_dir:
        s: Stack | None = None
        try:
            coordinator = start_service(
                "coordinator", *COMMON, "--redis-url", redis_server.url, "--group-lag-interval", "0.3s"
            )
            services.append(coordinator)
            services.append(
                start_service("broker", *COMMON, "--data-dir", data_dir, "--coordinator", coordinator.address)
            )
            services.append(start_service("offset-store", *COMMON, "--redis-url", redis_server.url))
            s = Stack(redis_server, coordinator, services[1], services[2], [])
            for name in ("lagsec", "fence"):
                s.coordinator_stub().CreateTopic(
                    coordinator_pb2.CreateTopicRequest(name=name, partitions=4), timeout=10
                )
            yield s
        finally:
            if s is not None:
                for channel in s.channels:
                    channel.close()
            for service in reversed(services):
                service.terminate()


def heartbeat(
    stub: coordinator_pb2_grpc.CoordinatorStub,
    group: str,
    topic: str,
    member_id: str = "",
    epoch: int = 0,
    owned: set[tuple[str, int]] | frozenset[tuple[str, int]] = frozenset(),
    rebalance_timeout_ms: int = 0,
) -> coordinator_pb2.GroupHeartbeatResponse:
    request = coordinator_pb2.GroupHeartbeatRequest(
        group=group,
        member_id=member_id,
        member_epoch=epoch,
        subscription={topic: "*"},
        owned=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(owned)],
        rebalance_timeout_ms=rebalance_timeout_ms,
    )
    response: coordinator_pb2.GroupHeartbeatResponse = stub.Heartbeat(request, timeout=10)
    return response


def test_lag_in_seconds_is_the_age_of_the_first_unconsumed_record(stack: Stack) -> None:
    now_ms = int(time.time() * 1000)
    # Records written 60 s .. 56 s ago (their own timestamps): offset 2 is 58 s old.
    stack.produce("lagsec", [now_ms - 60_000 + 1_000 * i for i in range(5)])
    stub = stack.coordinator_stub()
    member = heartbeat(stub, "lag-seconds", "lagsec")
    stack.commit("lag-seconds", member, "lagsec", 2)
    series = {"group": "lag-seconds", "track": "default", "topic": "lagsec", "partition": "0"}
    coordinator = stack.coordinator
    eventually(
        "lag of 3 records", lambda: value(coordinator, "sluice_coordinator_consumer_lag", **series) == 3
    )
    eventually(
        "lag in seconds",
        lambda: value(coordinator, "sluice_coordinator_consumer_lag_seconds", **series) is not None,
    )
    behind = value(coordinator, "sluice_coordinator_consumer_lag_seconds", **series)
    expected = (time.time() * 1000 - (now_ms - 58_000)) / 1000
    assert behind is not None
    assert expected - 5 <= behind <= expected + 1, (behind, expected)
    stack.commit("lag-seconds", member, "lagsec", 5)
    eventually(
        "caught up: 0 s behind",
        lambda: value(coordinator, "sluice_coordinator_consumer_lag_seconds", **series) == 0,
    )


def test_the_group_rebalance_timeout_bounds_the_members_and_fencing_is_counted_per_group(
    stack: Stack,
) -> None:
    stub = stack.coordinator_stub()
    group = "fence-me"
    set_config = coordinator_pb2.SetGroupConfigRequest(
        group=group, config=coordinator_pb2.GroupConfig(rebalance_timeout_ms=500, heartbeat_interval_ms=200)
    )
    stub.SetGroupConfig(set_config, timeout=10)
    coordinator = stack.coordinator
    fenced = "sluice_coordinator_fenced_members_total"
    # The group's series exist at 0 from the start, for every reason.
    eventually(
        "fenced series at 0",
        lambda: (
            value(coordinator, fenced, group=group, reason="rebalance_timeout") == 0
            and value(coordinator, fenced, group=group, reason="session_timeout") == 0
        ),
    )
    # A asks for a minute to release; the group allows half a second.
    a = heartbeat(stub, group, "fence", rebalance_timeout_ms=60_000)
    owned_by_a = {(p.topic, p.partition) for p in a.assignment.partitions}
    assert len(owned_by_a) == 4
    b = heartbeat(stub, group, "fence")
    started = time.monotonic()
    while True:  # A keeps heartbeating (its session stays alive) but never releases anything
        answer = heartbeat(stub, group, "fence", a.member_id, a.member_epoch, owned_by_a)
        if answer.error.code != common_pb2.NONE:
            break
        assert time.monotonic() - started < 10, "A was not fenced by the group's rebalance timeout"
        time.sleep(0.1)
    assert answer.error.code in (common_pb2.UNKNOWN_MEMBER, common_pb2.FENCED_MEMBER_EPOCH)
    assert time.monotonic() - started < 5  # the group's 0.5 s (+ sweeps), not A's 60 s
    b_epoch, b_held = b.member_epoch, set[tuple[str, int]]()

    def b_holds_everything() -> bool:
        """One heartbeat of B, adopting each assignment it gets (as the SDK does)."""
        nonlocal b_epoch, b_held
        answer = heartbeat(stub, group, "fence", b.member_id, b_epoch, b_held)
        if answer.HasField("assignment"):
            b_held = {(p.topic, p.partition) for p in answer.assignment.partitions}
        b_epoch = answer.member_epoch
        return len(b_held) == 4

    eventually("B holds every partition", b_holds_everything)
    eventually(
        "one fencing counted",
        lambda: value(coordinator, fenced, group=group, reason="rebalance_timeout") == 1,
    )
    assert value(coordinator, fenced, group=group, reason="session_timeout") == 0
    duration = "sluice_coordinator_rebalance_duration_seconds_count"
    eventually(
        "the rebalance's duration observed", lambda: (value(coordinator, duration, group=group) or 0) >= 1
    )
    assert (value(coordinator, "sluice_coordinator_rebalances_total", group=group) or 0) >= 1


def test_a_coordinator_that_stops_leading_exports_no_group_state() -> None:
    election = (
        "--election",
        "redis",
        "--lease-duration",
        "2s",
        "--renew-deadline",
        "1.2s",
        "--retry-period",
        "0.2s",
    )
    with run_redis() as r, tempfile.TemporaryDirectory() as data_dir:
        coordinator = start_service(
            "coordinator",
            *COMMON,
            "--redis-url",
            r.url,
            "--group-lag-interval",
            "0.3s",
            "--identity",
            "c1",
            *election,
        )
        broker = None
        try:
            broker = start_service(
                "broker", *COMMON, "--data-dir", data_dir, "--coordinator", coordinator.address
            )
            with grpc.insecure_channel(coordinator.address) as channel:
                stub = coordinator_pb2_grpc.CoordinatorStub(channel)
                stub.CreateTopic(coordinator_pb2.CreateTopicRequest(name="standby", partitions=2), timeout=20)
                heartbeat(stub, "standby-group", "standby")
            with redis.Redis.from_url(r.url) as raw:  # a committed offset, as the offset store writes it
                raw.hset(
                    GroupKeys("sluice").offsets("standby-group", "default"), partition_field("standby", 0), 0
                )
            lag_series = {"group": "standby-group", "track": "default", "topic": "standby", "partition": "0"}
            eventually(
                "the leader exports the group",
                lambda: (
                    value(coordinator, "sluice_coordinator_group_members", group="standby-group") == 1
                    and value(coordinator, "sluice_coordinator_groups", state="stable") == 1
                    and value(coordinator, "sluice_coordinator_consumer_lag", **lag_series) == 0
                    and value(coordinator, "sluice_coordinator_consumer_lag_seconds", **lag_series) == 0
                ),
            )
            # Someone else holds the lease now (for a minute): the leader's next renewal fails, it steps down.
            with redis.Redis.from_url(r.url) as raw:
                lease = json.loads(raw.get("sluice:coordinator:leader"))
                lease.update(
                    identity="thief", address="127.0.0.1:9", epoch=lease["epoch"] + 100, duration_ms=60_000
                )
                raw.set("sluice:coordinator:leader", json.dumps(lease), px=60_000)
            eventually(
                "stepped down",
                lambda: value(coordinator, "sluice_coordinator_election_leader") == 0,
                timeout=10,
            )
            exported = samples(coordinator)
            group_series = [
                key
                for key in exported
                if key[0].startswith(
                    (
                        "sluice_coordinator_group_members",
                        "sluice_coordinator_group_state",
                        "sluice_coordinator_consumer_lag",
                    )
                )
            ]
            assert group_series == [], group_series
            assert all(v == 0 for (name, _), v in exported.items() if name == "sluice_coordinator_groups"), (
                "a standby counts no groups"
            )
        finally:
            if broker is not None:
                broker.terminate()
            coordinator.terminate()
