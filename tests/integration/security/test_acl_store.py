"""``AclStore`` on a real private Redis: fencing by the coordinator epoch, one version step per change even
under concurrent writers, and a corrupt member failing the read instead of being skipped."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from sluice.common.redis_client import connect
from sluice.coordinator.acl_store import AclStore
from sluice.errors import NotCoordinator, StorageError
from sluice.security.acl import AclEntry, AclFilter
from tests.harness import RedisServer, run_redis


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    with run_redis() as r:
        yield r


def reads(principal: str, name: str = "t") -> AclEntry:
    return AclEntry.of(principal, "topic", name, "read")


def test_a_deposed_coordinator_cannot_change_an_acl(private_redis: RedisServer) -> None:
    async def scenario() -> None:
        redis = connect(private_redis.url)
        store = AclStore(redis, "fence")
        try:
            await redis.set(store.epoch_key, 7)
            added, version = await store.add(7, [reads("alice")])
            assert (added, version) == ([reads("alice")], 1)
            with pytest.raises(NotCoordinator, match=r"epoch 6\) was superseded by coordinator epoch 7"):
                await store.add(6, [reads("mallory")])
            with pytest.raises(NotCoordinator):
                await store.remove(6, [AclFilter()])
            with pytest.raises(NotCoordinator):
                await store.bump_version(6)
            held = await store.load()
            assert (list(held), held.version) == ([reads("alice")], 1)
            assert await store.bump_version(7) == 2  # a user change: the version moves, the ACLs do not
            assert list(await store.load()) == [reads("alice")]
        finally:
            await redis.aclose()

    asyncio.run(scenario())


def test_concurrent_changes_each_take_their_own_version(private_redis: RedisServer) -> None:
    async def scenario() -> None:
        redis = connect(private_redis.url)
        store = AclStore(redis, "race")
        try:
            await redis.set(store.epoch_key, 1)
            results = await asyncio.gather(*(store.add(1, [reads(f"u{i}")]) for i in range(50)))
            versions = sorted(v for _, v in results)
            assert versions == list(range(1, 51))
            # Removing all at once from many writers: each entry is removed (and reported) exactly once.
            removals = await asyncio.gather(
                *(store.remove(1, [AclFilter(principal=f"u{i}")]) for i in range(50))
            )
            assert sorted(e.principal for removed, _ in removals for e in removed) == sorted(
                f"u{i}" for i in range(50)
            )
            assert (await store.load()).version == 100
            assert len(await store.load()) == 0
        finally:
            await redis.aclose()

    asyncio.run(scenario())


def test_an_undecodable_member_fails_the_read(private_redis: RedisServer) -> None:
    async def scenario() -> None:
        redis = connect(private_redis.url)
        store = AclStore(redis, "corrupt")
        try:
            await redis.sadd(store.acls_key, '{"principal": "x"}')
            with pytest.raises(StorageError, match="undecodable ACL entry"):
                await store.load()
        finally:
            await redis.aclose()

    asyncio.run(scenario())
