"""Must show (issue 5, Election): two real ``sluice coordinator`` processes elect one leader on one Redis;
kill -9 the leader; the standby takes over within the lease time and clients keep working.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import redis

from sluice.coordinator.election import leader_hint
from sluice.errors import NotCoordinator, TopicAlreadyExists
from sluice.v1 import coordinator_pb2 as pb
from tests.harness import SERVICES, ServiceProcess, run_redis, start_service
from tests.integration.coordinator.coordinator_peers import peer_broker
from tests.integration.election.leader_client import LeaderFollower, typed

LEASE_S = 2.0
ELECTION = (
    "--election",
    "redis",
    "--lease-duration",
    "2s",
    "--renew-deadline",
    "1.2s",
    "--retry-period",
    "0.2s",
)


@pytest.fixture(autouse=True)
def _wired() -> None:
    """Fail fast (no half-started processes) while ``sluice coordinator`` has no ``--election``."""
    env = {**os.environ, "PYTHONPATH": str(SERVICES)}
    command = [sys.executable, "-m", "sluice", "coordinator", "--help"]
    usage = subprocess.run(command, capture_output=True, text=True, env=env, check=False, timeout=60).stdout
    assert "--election" in usage, "sluice coordinator is not wired to the election yet"


def coordinator(redis_url: str, identity: str) -> ServiceProcess:
    return start_service(
        "coordinator",
        "--port", "0", "--metrics-port", "0", "--redis-url", redis_url,
        "--broker-heartbeat-interval", "0.3s", "--broker-session-timeout", "3s",
        "--identity", identity, *ELECTION,
    )  # fmt: skip


def leader_of(client: LeaderFollower, address: str) -> str | None:
    """What the replica at ``address`` says the leader is (its own Metadata, forwarded if a standby)."""
    try:
        response = client.stub(address).Metadata(pb.MetadataRequest(topics=["-"]), timeout=2.0)
    except Exception:
        return None
    return (
        f"{response.coordinator.host}:{response.coordinator.port}"
        if response.HasField("coordinator")
        else None
    )


def wait_until(predicate: Callable[[], object], within: float, what: str) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > within:
            raise AssertionError(f"not within {within}s: {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def test_the_standby_takes_over_a_killed_leader_within_the_lease_and_clients_keep_working() -> None:
    with run_redis() as r, peer_broker(1) as broker:
        a = coordinator(r.url, "coord-a")
        b: ServiceProcess | None = None
        client = LeaderFollower([a.address])
        stop = threading.Event()
        try:
            wait_until(lambda: leader_of(client, a.address) == a.address, 5, "a leads")
            b = coordinator(r.url, "coord-b")
            client.bootstrap.append(b.address)
            # The standby forwards Metadata: it names the leader ...
            wait_until(lambda: leader_of(client, b.address) == a.address, 5, "b names a as the leader")
            # ... and refuses everything else, naming the leader.
            try:
                client.stub(b.address).ListTopics(pb.ListTopicsRequest(), timeout=2.0)
                raise AssertionError("a standby served ListTopics")
            except Exception as exc:  # grpc.RpcError
                error = typed(exc)  # type: ignore[arg-type]
                assert isinstance(error, NotCoordinator), error
                assert leader_hint(error.message) == a.address

            # A broker that follows the leader the same way (registers, then heartbeats).
            def heartbeats() -> None:
                follower = LeaderFollower([a.address, b.address])
                registered = False
                while not stop.is_set():
                    try:
                        if not registered:
                            request = pb.RegisterBrokerRequest(
                                broker_id=1,
                                endpoint=pb.Endpoint(host="127.0.0.1", port=broker.port),
                                incarnation=broker.incarnation,
                            )
                            broker.epoch = follower.call("RegisterBroker", request).broker_epoch
                            registered = True
                        response = follower.call(
                            "BrokerHeartbeat",
                            pb.BrokerHeartbeatRequest(
                                broker_id=1, broker_epoch=broker.epoch, metadata_version=broker.version
                            ),
                        )
                        if response.HasField("update"):
                            broker.apply(response.update)
                        registered = not response.HasField("error")
                    except Exception:
                        pass
                    stop.wait(0.2)
                follower.close()

            beat = threading.Thread(target=heartbeats, daemon=True)
            beat.start()
            wait_until(lambda: broker.epoch > 0, 5, "the broker registered with the leader")

            created: list[str] = []
            successes: list[float] = []
            failures: list[str] = []

            def workload() -> None:
                i = 0
                while not stop.is_set():
                    name = f"t-{i}"
                    try:
                        # TOPIC_ALREADY_EXISTS: a retried create whose first answer was lost is there.
                        with contextlib.suppress(TopicAlreadyExists):
                            client.call("CreateTopic", pb.CreateTopicRequest(name=name, partitions=1))
                        created.append(name)
                        listed = {t.name for t in client.call("ListTopics", pb.ListTopicsRequest()).topics}
                        assert set(created) <= listed, set(created) - listed
                        successes.append(time.monotonic())
                    except Exception as exc:
                        failures.append(repr(exc))
                    i += 1
                    stop.wait(0.05)

            work = threading.Thread(target=workload, daemon=True)
            work.start()
            wait_until(lambda: len(successes) >= 5, 10, "the client works against the first leader")

            a.kill()  # kill -9: no resign, the lease must expire
            killed = time.monotonic()
            took = wait_until(lambda: leader_of(client, b.address) == b.address, LEASE_S + 3, "b leads")
            assert took <= LEASE_S + 1.0, f"the standby took {took:.2f}s (lease {LEASE_S}s)"

            before = len(successes)
            wait_until(lambda: len(successes) >= before + 5, 10, "the client works against the new leader")
            stop.set()
            work.join(10)
            beat.join(10)

            assert not failures, failures
            gap = max(later - earlier for earlier, later in itertools.pairwise(successes))
            assert gap <= LEASE_S + 3.0, f"the client stalled for {gap:.2f}s"
            assert any(s > killed for s in successes)
            final = {t.name for t in client.call("ListTopics", pb.ListTopicsRequest()).topics}
            assert set(created) <= final, "an acknowledged create was lost in the failover"

            with redis.Redis.from_url(r.url) as raw:
                assert int(raw.get("sluice:coordinator:epoch")) == 2, "one epoch per term"
                assert b"coord-b" in raw.get("sluice:coordinator:leader")
        finally:
            stop.set()
            client.close()
            if b is not None:
                b.terminate()
            a.terminate()


def test_a_terminated_leader_releases_the_lease_and_the_standby_takes_over_at_once() -> None:
    with run_redis() as r:
        a = coordinator(r.url, "coord-a")
        b: ServiceProcess | None = None
        client = LeaderFollower([a.address])
        try:
            wait_until(lambda: leader_of(client, a.address) == a.address, 5, "a leads")
            b = coordinator(r.url, "coord-b")
            wait_until(lambda: leader_of(client, b.address) == a.address, 5, "b follows a")
            assert a.terminate() == 0  # SIGTERM: the leader resigns and releases the lease
            stopped = time.monotonic()
            took = wait_until(lambda: leader_of(client, b.address) == b.address, LEASE_S, "b leads")
            assert time.monotonic() - stopped < LEASE_S / 2, f"took {took:.2f}s: the lease was not released"
            with redis.Redis.from_url(r.url) as raw:
                assert int(raw.get("sluice:coordinator:epoch")) == 2
        finally:
            client.close()
            if b is not None:
                b.terminate()
            a.terminate()
