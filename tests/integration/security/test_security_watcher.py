"""``SecurityWatcher`` in the test process against real ``sluice coordinator`` processes and Redis.

An ACL created through the RPC reaches the watcher's authorizer within a bound (the long poll ends on the
change: no polling interval to wait out); a restarted coordinator is polled again and its changes arrive; a
watcher pointed at a standby follows the leader it names; ``stop`` ends a poll in progress at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from sluice.common.peers import AioPeers
from sluice.security.acl import AclAuthorizer, AclSet
from sluice.security.model import Operation, Principal, Resource, ResourceType
from sluice.security.watcher import SecurityWatcher
from sluice.v1 import acl_pb2 as pb
from tests.harness import RedisServer, free_port, run_redis, start_service
from tests.integration.coordinator.coordinator_peers import Coordinator, run_coordinator

ALICE = Principal("alice", "scram")
ORDERS = Resource(ResourceType.TOPIC, "orders")
#: A change must arrive well within this (it takes milliseconds: the poll is waiting for it).
ARRIVES_WITHIN_S = 2.0


def alice_reads(name: str = "orders") -> pb.AclEntry:
    return pb.AclEntry(
        principal="alice",
        resource_type="topic",
        pattern="literal",
        name=name,
        operation="read",
        permission="allow",
    )


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    with run_redis() as r:
        yield r


@pytest.fixture(scope="module")
def coordinator(private_redis: RedisServer) -> Iterator[Coordinator]:
    args = ("--port", str(free_port()), "--metrics-port", "0", "--redis-url", private_redis.url)
    with run_coordinator(*args, "--key-prefix", "watch") as c:
        yield c


async def until(predicate: Callable[[], bool], within: float, what: str) -> float:
    """Seconds until ``predicate`` held (checked every 10 ms), or AssertionError after ``within``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > within:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def test_a_created_acl_arrives_and_a_restarted_coordinator_is_followed(coordinator: Coordinator) -> None:
    async def scenario() -> None:
        authorizer = AclAuthorizer(AclSet())
        changes: list[int] = []
        authorizer.on_change(lambda acls: changes.append(acls.version))
        peers = AioPeers()
        watcher = SecurityWatcher(coordinator.address, authorizer, max_wait_ms=20_000)
        watcher.start()
        try:
            await asyncio.wait_for(watcher.synced.wait(), 10)
            assert not authorizer.allowed(ALICE, Operation.READ, ORDERS)  # default deny, nothing yet
            acls = peers.acls(coordinator.address)
            created = await acls.CreateAcls(pb.CreateAclsRequest(acls=[alice_reads()]), timeout=10)
            took = await until(
                lambda: authorizer.allowed(ALICE, Operation.READ, ORDERS), ARRIVES_WITHIN_S, "the new ACL"
            )
            print(f"ACL change reached the watcher in {took * 1000:.0f} ms")
            assert watcher.version == authorizer.version == created.version
            assert changes[-1] == created.version

            # Removed: refused again, through the same path.
            await acls.DeleteAcls(pb.DeleteAclsRequest(filters=[pb.AclFilter(principal="alice")]), timeout=10)
            await until(
                lambda: not authorizer.allowed(ALICE, Operation.READ, ORDERS), ARRIVES_WITHIN_S, "the removal"
            )

            # The coordinator crashes and comes back (same address): the watcher keeps its last snapshot
            # meanwhile and resumes polling the new process.
            held = watcher.version
            await asyncio.to_thread(coordinator.stop, True)
            await asyncio.sleep(0.5)
            assert watcher.version == held
            await asyncio.to_thread(coordinator.restart)
            # wait_for_ready: the channel is still in its reconnect backoff from the crash.
            again = await peers.acls(coordinator.address).CreateAcls(
                pb.CreateAclsRequest(acls=[alice_reads("payments")]), timeout=10, wait_for_ready=True
            )
            payments = Resource(ResourceType.TOPIC, "payments")
            # Bounded by the watcher's longest backoff (2 s) plus a poll.
            await until(
                lambda: authorizer.allowed(ALICE, Operation.READ, payments), 8, "a change after restart"
            )
            assert watcher.version == again.version > held
        finally:
            await watcher.stop()
            await peers.close()

    asyncio.run(scenario())


def test_stop_ends_a_waiting_poll_at_once(coordinator: Coordinator) -> None:
    async def scenario() -> float:
        watcher = SecurityWatcher(coordinator.address, AclAuthorizer(AclSet()), max_wait_ms=60_000)
        watcher.start()
        await asyncio.wait_for(watcher.synced.wait(), 10)
        await asyncio.sleep(0.2)  # the next poll is now waiting on the coordinator
        started = time.monotonic()
        await watcher.stop()
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 1.0


def test_a_watcher_pointed_at_a_standby_follows_the_leader() -> None:
    election = ("--election", "redis", "--lease-duration", "2s", "--renew-deadline", "1.2s")
    with run_redis() as r:
        common = (
            "--port",
            "0",
            "--metrics-port",
            "0",
            "--redis-url",
            r.url,
            *election,
            "--retry-period",
            "0.2s",
        )
        leader = start_service("coordinator", *common, "--identity", "c1")
        standby = start_service("coordinator", *common, "--identity", "c2")
        try:

            async def scenario() -> str:
                authorizer = AclAuthorizer(AclSet())
                watcher = SecurityWatcher(standby.address, authorizer, max_wait_ms=20_000)
                peers = AioPeers()
                watcher.start()
                try:
                    await asyncio.wait_for(watcher.synced.wait(), 15)
                    await peers.acls(leader.address).CreateAcls(
                        pb.CreateAclsRequest(acls=[alice_reads()]), timeout=10
                    )
                    await until(lambda: authorizer.allowed(ALICE, Operation.READ, ORDERS), 5, "the ACL")
                    return watcher.target
                finally:
                    await watcher.stop()
                    await peers.close()

            assert asyncio.run(scenario()) == leader.address
        finally:
            standby.terminate()
            leader.terminate()
