"""Two alerts against the real thing, which the healthy-workload test cannot show. SluiceRedisUnavailable: an
offset store whose Redis is killed answers with the error codes the rule matches, and a real Prometheus
scraping it evaluates the shipped expression to a firing vector (the rule's `for` aside). SluiceServiceDown:
a killed service's target makes the expression return that job and instance."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

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
