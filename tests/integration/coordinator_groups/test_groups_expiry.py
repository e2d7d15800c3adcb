"""Groups that end (issue 20), with real redis-server, coordinator, broker and offset-store processes:

- 300 empty groups (a member joined, committed, left) are exported on /metrics at most
  ``--group-metrics-max`` at a time, every one still counted;
- lag is refreshed for a live group (right) and for an empty group once DescribeGroup asked about it,
  not for the other empty groups; the brokers are asked for a partition's log end once per refresh,
  however many groups read it;
- a coordinator restarted with a 2 s retention expires every empty group whole: no key of theirs is left
  in Redis (SCAN), no record, no topic ref; the live group keeps everything.
"""

from __future__ import annotations

import tempfile
import time
import urllib.request
from collections.abc import Callable

import grpc
import redis

from sluice.codec.batch import BatchBuilder
from sluice.v1 import (
    broker_pb2,
    broker_pb2_grpc,
    common_pb2,
    coordinator_pb2,
    coordinator_pb2_grpc,
    offset_store_pb2,
    offset_store_pb2_grpc,
)
from tests.harness import ServiceProcess, run_redis, start_service

GROUPS = 300
CAP = 40
TOPIC = "ends"


def metrics(service: ServiceProcess) -> str:
    with urllib.request.urlopen(f"http://{service.metrics}/metrics", timeout=10) as response:
        return str(response.read().decode())


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one series in a /metrics page (labels exactly as given)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series == (f"{name}{{{wanted}}}" if labels else name):
            return float(value)
    return None


def exported_groups(text: str) -> set[str]:
    return {line.split('group="')[1].split('"')[0] for line in text.splitlines() if 'group="' in line}


def eventually(what: str, condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Another process's timers: no event to wait on from here."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.1)


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def list_offsets_calls(broker: ServiceProcess) -> float:
    """ListOffsets requests the broker has handled (its per-RPC counter)."""
    total = 0.0
    for line in metrics(broker).splitlines():
        if line.startswith("sluice_broker_rpc_requests_total{") and 'method="ListOffsets"' in line:
            total += float(line.rpartition(" ")[2])
    return total


def group_keys(r: redis.Redis, groups: set[str]) -> list[str]:
    found = []
    for pattern in ("sluice:grp:*", "sluice:off:*"):
        for key in r.scan_iter(match=pattern, count=1000):
            name = as_text(key)
            if name.partition("{")[2].partition("}")[0] in groups:
                found.append(name)
    return found


class Cluster:
    def __init__(self, coordinator: ServiceProcess, store: ServiceProcess, broker: ServiceProcess) -> None:
        self.coordinator_channel = grpc.insecure_channel(coordinator.address)
        self.store_channel = grpc.insecure_channel(store.address)
        self.broker_channel = grpc.insecure_channel(broker.address)
        self.coordinator = coordinator_pb2_grpc.CoordinatorStub(self.coordinator_channel)
        self.store = offset_store_pb2_grpc.OffsetStoreStub(self.store_channel)
        self.broker = broker_pb2_grpc.BrokerStub(self.broker_channel)

    def close(self) -> None:
        for channel in (self.coordinator_channel, self.store_channel, self.broker_channel):
            channel.close()

    def join_and_commit(self, group: str, offset: int) -> coordinator_pb2.GroupHeartbeatResponse:
        joined: coordinator_pb2.GroupHeartbeatResponse = self.coordinator.Heartbeat(
            coordinator_pb2.GroupHeartbeatRequest(group=group, member_epoch=0, subscription={TOPIC: "*"}),
            timeout=10,
        )
        assert joined.error.code == common_pb2.NONE, joined.error
        done = self.store.CommitOffsets(
            offset_store_pb2.CommitOffsetsRequest(
                group=group,
                member_id=joined.member_id,
                member_epoch=joined.member_epoch,
                offsets=[offset_store_pb2.PartitionOffset(topic=TOPIC, partition=0, offset=offset)],
            ),
            timeout=10,
        )
        assert done.results[0].error.code == common_pb2.NONE, done
        return joined

    def leave(self, group: str, member: coordinator_pb2.GroupHeartbeatResponse) -> None:
        left = self.coordinator.Heartbeat(
            coordinator_pb2.GroupHeartbeatRequest(
                group=group, member_id=member.member_id, member_epoch=-1, subscription={TOPIC: "*"}
            ),
            timeout=10,
        )
        assert left.error.code == common_pb2.NONE, left.error

    def produce(self, count: int) -> None:
        batch = BatchBuilder()
        for i in range(count):
            batch.append(b"v%d" % i, None, None, None, int(time.time() * 1000))
        request = broker_pb2.ProduceRequest(acks=1, timeout_ms=5000)
        request.partitions.add(topic=TOPIC, partition=0, records=batch.build())
        answer = self.broker.Produce(request, timeout=10)
        assert answer.partitions[0].error.code == common_pb2.NONE, answer


def test_empty_groups_are_bounded_on_metrics_get_lag_only_when_live_or_asked_and_expire_whole() -> None:
    with run_redis() as r, tempfile.TemporaryDirectory() as data_dir:
        flags = ("--port", "0", "--metrics-port", "0", "--redis-url", r.url)
        lag = ("--group-lag-interval", "0.3s", "--group-metrics-max", str(CAP))
        coordinator = start_service("coordinator", *flags, *lag)
        running = [coordinator]
        cluster = None
        try:
            broker = start_service(
                "broker", "--port", "0", "--metrics-port", "0", "--data-dir", data_dir,
                "--coordinator", coordinator.address,
            )  # fmt: skip
            running.append(broker)
            store = start_service("offset-store", *flags)
            running.append(store)
            cluster = Cluster(coordinator, store, broker)
            cluster.coordinator.CreateTopic(
                coordinator_pb2.CreateTopicRequest(name=TOPIC, partitions=1), timeout=20
            )
            cluster.produce(5)
            live = cluster.join_and_commit("live", 2)  # stays: its session (45 s) outlasts the test
            empty = [f"g-{i:03d}" for i in range(GROUPS)]
            for name in empty:
                cluster.leave(name, cluster.join_and_commit(name, 1))

            # A live group's lag is right; an empty group has none until someone asks about it.
            series = {"group": "live", "track": "default", "topic": TOPIC, "partition": "0"}
            eventually(
                "the live group's lag",
                lambda: sample(metrics(coordinator), "sluice_coordinator_consumer_lag", **series) == 3,
            )
            # Log-end offsets once per partition per refresh, however many groups read it: three live
            # groups on the one partition, ten refreshes in 3 s, so at most ~10 ListOffsets (was one per
            # group ever seen per refresh: 3,000 here).
            for extra in ("live-b", "live-c"):
                cluster.join_and_commit(extra, 0)
            eventually(
                "three live groups' lag",
                lambda: (
                    sample(
                        metrics(coordinator),
                        "sluice_coordinator_consumer_lag",
                        **{**series, "group": "live-c"},
                    )
                    == 5
                ),
            )
            calls = list_offsets_calls(broker)
            time.sleep(3.0)
            calls = list_offsets_calls(broker) - calls
            assert 0 < calls <= 3.0 / 0.3 + 2, calls
            asked = {**series, "group": "g-007"}
            time.sleep(1.0)  # three lag refreshes
            assert sample(metrics(coordinator), "sluice_coordinator_consumer_lag", **asked) is None
            described = cluster.coordinator.DescribeGroup(
                coordinator_pb2.DescribeGroupRequest(group="g-007"), timeout=10
            )
            assert [(x.committed, x.lag) for x in described.lag] == [(1, 4)]
            eventually(
                "the asked group's lag",
                lambda: sample(metrics(coordinator), "sluice_coordinator_consumer_lag", **asked) == 4,
            )

            # Per-group series: at most CAP groups, the live and the asked one among them; all counted.
            text = metrics(coordinator)
            shown = exported_groups(text)
            assert len(shown) <= CAP, len(shown)
            assert {"live", "g-007"} <= shown
            assert sample(text, "sluice_coordinator_groups", state="empty") == GROUPS
            assert sample(text, "sluice_coordinator_groups_not_exported") == GROUPS + 3 - len(shown)
            per_group = sum(len(line) + 1 for line in text.splitlines() if 'group="' in line)
            assert per_group <= CAP * 3_000, per_group  # ~2.3 KB a group (histogram buckets mostly)

            # Restarted with a 2 s retention: every empty group goes, with every key; the live one stays.
            before = group_keys(redis.Redis.from_url(r.url), set(empty))
            assert len(before) >= GROUPS  # each at least its offsets hash and its live count
            coordinator.terminate()
            coordinator = start_service("coordinator", *flags, *lag, "--group-offsets-retention", "2s")
            running.append(coordinator)
            raw = redis.Redis.from_url(r.url)
            eventually(
                "every empty group's keys deleted", lambda: not group_keys(raw, set(empty)), timeout=30
            )
            fields = [as_text(f) for f in raw.hkeys("sluice:coordinator:records")]
            kept = ["live", "live-b", "live-c"]
            assert sorted(f for f in fields if f.startswith(("group:", "grpconfig:"))) == [
                f"group:{g}" for g in kept
            ]
            refs = [as_text(f) for f in raw.hkeys(f"sluice:topic:{{{TOPIC}}}:refs")]
            assert sorted(f for f in refs if ":off:" in f) == sorted(
                f"sluice:off:{{{g}}}:default" for g in kept
            )
            assert raw.hget("sluice:off:{live}:default", f"{TOPIC}/0") == b"2"
            raw.close()
            del live
        finally:
            if cluster is not None:
                cluster.close()
            for service in reversed(running):
                service.terminate()
