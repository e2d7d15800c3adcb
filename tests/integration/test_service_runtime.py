"""The shared bootstrap, seen from outside: health, /metrics, typed errors, graceful stop."""

from __future__ import annotations

import signal
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.client.rpc import error_from_rpc
from sluice.errors import InvalidArgument
from sluice.v1 import offset_store_pb2, offset_store_pb2_grpc
from tests.harness import run_redis, start_service


def test_health_metrics_errors_and_graceful_stop() -> None:
    with run_redis(appendonly=False) as redis:
        svc = start_service("offset-store", "--port", "0", "--metrics-port", "0", "--redis-url", redis.url)
        try:
            with grpc.insecure_channel(svc.address) as channel:
                health = health_pb2_grpc.HealthStub(channel)
                status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
                assert status == health_pb2.HealthCheckResponse.SERVING
                stub = offset_store_pb2_grpc.OffsetStoreStub(channel)
                with pytest.raises(grpc.RpcError) as failed:
                    stub.FetchOffsets(offset_store_pb2.FetchOffsetsRequest(group=""), timeout=5)
                assert isinstance(error_from_rpc(failed.value), InvalidArgument)
            with urllib.request.urlopen(f"http://{svc.metrics}/metrics", timeout=5) as resp:
                text = resp.read().decode()
            assert (
                'sluice_offset_store_rpc_requests_total{code="INVALID_ARGUMENT",method="FetchOffsets"} 1.0'
                in text
            )
            assert "sluice_offset_store_rpc_duration_seconds_bucket" in text
        finally:
            svc.process.send_signal(signal.SIGTERM)
            assert svc.process.wait(15) == 0
        assert "SLUICE_STOPPED service=offset-store" in svc.log()
