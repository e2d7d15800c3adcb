"""Two alerts against the real thing, which the healthy-workload test cannot show. SluiceRedisUnavailable: an
offset store whose Redis is killed, or is up but refuses writes (reads still answered), answers with the
error codes the rule matches, and a real Prometheus scraping it evaluates the shipped expression to a firing
vector (the rule's `for` aside). SluiceServiceDown:
a killed service's target makes the expression return that job and instance."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
import redis

from sluice.v1 import offset_store_pb2, offset_store_pb2_grpc
from tests.harness import run_redis, run_service
from tests.metrics.alerts import rules
from tests.metrics.prometheus import Target, run_prometheus


def test_a_dead_redis_fires_the_redis_alert_expression(tmp_path: Path) -> None:
    (rule,) = [r for r in rules() if r.alert == "SluiceRedisUnavailable"]
    with (
        run_redis(appendonly=False) as redis,
        run_service("offset-store", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url) as store,
        run_prometheus(
            tmp_path / "prom", [Target("offset-store", store.metrics)], {"namespace": "ops"}
        ) as prom,
        grpc.insecure_channel(store.address) as channel,
    ):
        prom.wait_targets_up(1)
        stub = offset_store_pb2_grpc.OffsetStoreStub(channel)
        stub.FetchOffsets(offset_store_pb2.FetchOffsetsRequest(group="g"), timeout=10)  # Redis answers
        assert not prom.query(rule.expr)
        redis.kill()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # a request a second, as clients retrying would send
            with pytest.raises(grpc.RpcError) as refused:
                stub.FetchOffsets(offset_store_pb2.FetchOffsetsRequest(group="g"), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            if firing := prom.query(rule.expr):
                break
            time.sleep(1)
        else:
            raise AssertionError(f"{rule.expr} never returned a series with Redis dead")
        assert [s["metric"] for s in firing] == [{"namespace": "ops"}]


def test_a_redis_that_refuses_writes_fires_the_redis_alert_expression(tmp_path: Path) -> None:
    """Redis up and answering reads, but refusing every write (here `min-replicas-to-write 1` with no
    replica: `NOREPLICAS`, as a primary that lost its replicas answers; an OOM under `noeviction` is the
    same kind of refusal): commits fail, and the alert's expression fires."""
    (rule,) = [r for r in rules() if r.alert == "SluiceRedisUnavailable"]
    group = "g"
    with (
        run_redis(appendonly=False) as server,
        run_service("offset-store", "--port", "0", "--metrics-port", "0", "--redis-url", server.url) as store,
        run_prometheus(
            tmp_path / "prom", [Target("offset-store", store.metrics)], {"namespace": "ops"}
        ) as prom,
        grpc.insecure_channel(store.address) as channel,
        redis.Redis.from_url(server.url) as admin,
    ):
        prom.wait_targets_up(1)
        stub = offset_store_pb2_grpc.OffsetStoreStub(channel)
        # The topic and the group as the coordinator writes them, so a commit gets as far as its write.
        admin.set("sluice:topic:{t}:id", "id-t")
        admin.hset(f"sluice:grp:{{{group}}}:members", "m1", 1)
        admin.hset(f"sluice:grp:{{{group}}}:owners", "t/0", "m1")
        admin.set(f"sluice:grp:{{{group}}}:live", 1)

        def commit(offset: int) -> offset_store_pb2.CommitOffsetsResponse:
            request = offset_store_pb2.CommitOffsetsRequest(group=group, member_id="m1", member_epoch=1)
            request.offsets.add(topic="t", partition=0, offset=offset)
            response: offset_store_pb2.CommitOffsetsResponse = stub.CommitOffsets(request, timeout=10)
            return response

        (ok,) = commit(5).results
        assert ok.offset == 5, ok
        assert not prom.query(rule.expr)
        admin.config_set("min-replicas-to-write", 1)
        deadline = time.monotonic() + 60
        offset = 6
        while time.monotonic() < deadline:  # a commit a second, as a consumer retrying would send
            with pytest.raises(grpc.RpcError) as refused:
                commit(offset)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "NOREPLICAS" in str(refused.value.details())
            stub.FetchOffsets(offset_store_pb2.FetchOffsetsRequest(group=group), timeout=10)  # reads work
            if firing := prom.query(rule.expr):
                break
            offset += 1
            time.sleep(1)
        else:
            raise AssertionError(f"{rule.expr} never returned a series with Redis refusing writes")
        assert [s["metric"] for s in firing] == [{"namespace": "ops"}]
        assert admin.hget(f"sluice:off:{{{group}}}:default", "t/0") == b"5"  # nothing refused was stored


def test_a_stopped_service_fires_the_service_down_expression(tmp_path: Path) -> None:
    (rule,) = [r for r in rules() if r.alert == "SluiceServiceDown"]
    with (
        run_redis(appendonly=False) as redis,
        run_service("offset-store", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url) as store,
        run_prometheus(tmp_path / "p", [Target("offset-store", store.metrics)], {"namespace": "ops"}) as prom,
    ):
        prom.wait_targets_up(1)
        assert not prom.query(rule.expr)
        store.kill()
        prom.wait_until(rule.expr, timeout=60)
        (down,) = prom.query(rule.expr)
        assert down["metric"]["job"] == "offset-store"
        assert down["metric"]["instance"] == store.metrics
