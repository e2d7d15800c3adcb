"""``--metadata-replicas``: the coordinator's metadata writes wait for a Redis replica (``WAIT``), as the
offset store's commits do with ``--commit-replicas`` (docs/replication.md, "Controller state that cannot
roll back"; docs/offset-store.md, "Redis failover"). Real processes: a primary, a replica and a Sentinel.

With the replica connected a broker registers and its record is on the replica. With the replica paused
and its link cut, a metadata write is answered NOT_ENOUGH_REPLICAS (typed, retriable) instead of being
acted on, and no broker is told; once the replica is back, writes are acknowledged again."""

from __future__ import annotations

import os
import signal
import time

import grpc
import pytest
import redis
from tests.harness import run_redis_sentinel, start_service

from sluice.common.rpc import error_from_rpc
from sluice.coordinator.config import CoordinatorConfig
from sluice.errors import InvalidArgument, NotEnoughReplicas
from sluice.v1 import coordinator_pb2 as cpb
from sluice.v1 import coordinator_pb2_grpc

RECORDS = "sluice:coordinator:records"


def _register(stub: coordinator_pb2_grpc.CoordinatorStub, broker_id: int) -> None:
    """A metadata write (a broker record) that needs no broker process: nothing connects to it."""
    stub.RegisterBroker(
        cpb.RegisterBrokerRequest(
            broker_id=broker_id,
            endpoint=cpb.Endpoint(host="127.0.0.1", port=1),
            incarnation=f"incarnation-{broker_id}",
        ),
        timeout=10,
    )


def _replica_has(port: int, field: str) -> bool:
    with redis.Redis(port=port, socket_timeout=2) as r:
        return bool(r.hexists(RECORDS, field))


def _replica_online(primary_port: int, timeout: float = 30) -> None:
    """Until the replica finished its first sync (Redis 7 delays a diskless one by 5 s): before that,
    WAIT counts it as holding nothing."""
    deadline = time.monotonic() + timeout
    with redis.Redis(port=primary_port, socket_timeout=2) as r:
        while r.info("replication").get("slave0", {}).get("state") != "online":
            assert time.monotonic() < deadline, "the replica never came online"
            time.sleep(0.1)


def test_metadata_writes_wait_for_a_replica_and_are_refused_without_one() -> None:
    with run_redis_sentinel() as sentinels:
        _replica_online(sentinels.primary.port)
        coordinator = start_service(
            "coordinator", "--port", "0", "--metrics-port", "0", "--redis-url", sentinels.url,
            "--metadata-replicas", "1",
        )  # fmt: skip
        channel = grpc.insecure_channel(coordinator.address)
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        try:
            _register(stub, 1)
            # Acknowledged only once the replica had it: read it there (WAIT returned 1).
            assert _replica_has(sentinels.replica.port, "broker:1")
            os.kill(sentinels.replica.process.pid, signal.SIGSTOP)
            try:
                # Pausing alone is not enough (what was sent waits in its socket): cut the link too.
                with redis.Redis(port=sentinels.primary.port) as r:
                    r.client_kill_filter(_type="replica")
                with pytest.raises(grpc.RpcError) as refused:
                    _register(stub, 2)
                error = error_from_rpc(refused.value)
                assert isinstance(error, NotEnoughReplicas), error
                assert error.retriable
                assert "held by 0 of the 1 replicas" in error.message
            finally:
                os.kill(sentinels.replica.process.pid, signal.SIGCONT)
            # The replica reconnects (a full or partial resync): writes are acknowledged again.
            deadline = time.monotonic() + 30
            while True:
                try:
                    _register(stub, 3)
                    break
                except grpc.RpcError as exc:
                    failure = error_from_rpc(exc)
                if not isinstance(failure, NotEnoughReplicas) or time.monotonic() > deadline:
                    raise AssertionError(f"writes were not acknowledged again: {failure}")
                time.sleep(0.2)
            assert _replica_has(sentinels.replica.port, "broker:3")
        finally:
            channel.close()
            coordinator.terminate()


@pytest.mark.parametrize(("replicas", "timeout_ms"), [(-1, 2000), (17, 2000), (1, 0), (1, 60_001)])
def test_metadata_replicas_out_of_range_is_refused_naming_the_flag(replicas: int, timeout_ms: int) -> None:
    config = CoordinatorConfig(
        redis_url="redis://127.0.0.1:6379/0",
        metadata_replicas=replicas,
        metadata_replicas_timeout_ms=timeout_ms,
    )
    with pytest.raises(InvalidArgument, match="--metadata-replicas"):
        config.validate()
