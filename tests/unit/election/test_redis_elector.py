"""The Redis elector against a real private Redis: two (or three) electors in one process compete."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

from sluice.coordinator.cluster.records import new_cluster_record
from sluice.coordinator.election.base import Candidate
from sluice.coordinator.election.machine import ElectionTiming, LeaseRecord
from sluice.coordinator.election.redis_elector import RedisElector, RedisLeaseStore, epoch_key, leader_key
from sluice.coordinator.state import CoordinatorState
from sluice.coordinator.store import MetadataStore
from sluice.errors import NotCoordinator, StorageError
from tests.harness import run_redis
from tests.unit.election.electors import FAST, Running, redis_client, stop_all, unreachable_redis

PREFIX = "t"


def elector(redis: Redis, name: str, timing: ElectionTiming = FAST, address: str = "") -> RedisElector:
    return RedisElector(redis, PREFIX, name, address or f"{name}.test:7600", timing)


def metadata_store(redis: Redis) -> MetadataStore:
    return MetadataStore(redis, PREFIX, CoordinatorState().codec)


def test_keys_are_the_ones_the_metadata_store_fences_on() -> None:
    async def check() -> None:
        async with unreachable_redis() as redis:
            assert epoch_key(PREFIX) == metadata_store(redis).epoch_key
            assert leader_key(PREFIX) == "t:coordinator:leader"

    asyncio.run(check())


def test_one_leader_the_standby_takes_over_a_killed_leader_and_fences_it() -> None:
    async def scenario(url: str) -> None:
        async with redis_client(url) as ra, redis_client(url) as rb, redis_client(url) as rs:
            a = Running(elector(ra, "a")).start()
            await a.wait_for("leader")
            b = Running(elector(rb, "b")).start()
            await b.wait_for("follower")
            assert b.elector.leader() == a.elector.leader()
            assert a.epochs == [1]
            assert b.epochs == []
            await asyncio.sleep(FAST.lease_duration * 1.5)  # renewals keep a in office
            assert a.elector.is_leader()
            assert not b.elector.is_leader()

            store = metadata_store(rs)
            record = new_cluster_record(1, 0, 0)
            await store.write(a.epochs[0], [record])  # the leader's epoch is the store's fencing token

            await a.crash()
            killed = time.monotonic()
            await b.wait_for("leader", within=FAST.lease_duration * 3)
            took = time.monotonic() - killed
            # Within the lease (+ one read period, + scheduling slack on a busy machine).
            assert took <= FAST.lease_duration + 2 * FAST.retry_period + 0.6, took
            assert b.epochs == [2], "a new, higher epoch"
            info = b.elector.leader()
            assert info is not None
            assert (info.identity, info.address, info.epoch) == ("b", "b.test:7600", 2)

            # The deposed leader's write is refused by the store's Lua fence; the new leader's lands.
            with pytest.raises(NotCoordinator, match="superseded by coordinator epoch 2"):
                await store.write(a.epochs[0], [new_cluster_record(99, 0, 0)])
            await store.write(b.epochs[0], [new_cluster_record(2, 0, 0)])
            assert await store.load() == [new_cluster_record(2, 0, 0)]
            await stop_all(b)

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


def test_resign_releases_the_lease_so_the_standby_takes_over_at_once() -> None:
    slow = ElectionTiming(lease_duration=5.0, renew_deadline=3.0, retry_period=0.1)

    async def scenario(url: str) -> None:
        async with redis_client(url) as ra, redis_client(url) as rb:
            a = Running(elector(ra, "a", slow)).start()
            await a.wait_for("leader")
            b = Running(elector(rb, "b", slow)).start()
            await b.wait_for("follower")
            start = time.monotonic()
            await a.elector.resign()
            assert a.lost == 1, "on_lost ran before resign() returned"
            assert not a.elector.is_leader()
            await b.wait_for("leader", within=2)
            assert time.monotonic() - start < 1.0, "no waiting for the 5 s lease to expire"
            assert b.epochs == [2]
            await stop_all(a, b)

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


def test_a_restarted_replica_at_the_same_address_takes_over_its_dead_predecessor_at_once() -> None:
    slow = ElectionTiming(lease_duration=5.0, renew_deadline=3.0, retry_period=0.1)

    async def scenario(url: str) -> None:
        async with redis_client(url) as r1, redis_client(url) as r2:
            old = Running(elector(r1, "pid-1", slow, address="host:7600")).start()
            await old.wait_for("leader")
            await old.crash()
            start = time.monotonic()
            new = Running(elector(r2, "pid-2", slow, address="host:7600")).start()
            await new.wait_for("leader", within=2)
            assert time.monotonic() - start < 1.0
            assert new.epochs == [2]
            await stop_all(new)

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


def test_the_leader_steps_down_before_its_lease_expires_when_redis_goes_away_and_returns() -> None:
    async def scenario(server_url: str, kill: Callable[[], object], restart: Callable[[], object]) -> None:
        async with redis_client(server_url) as ra:
            a = Running(elector(ra, "a")).start()
            await a.wait_for("leader")
            kill()
            # No renewal can succeed from now on: by the renew deadline it must not lead any more, well
            # before the 1 s lease could expire and be handed to someone else. (is_leader() reads the
            # clock, so this holds however late the event loop gets round to stepping down.)
            await asyncio.sleep(FAST.renew_deadline + 0.02)
            assert not a.elector.is_leader()
            await a.wait_for("lost:1", within=3)
            restart()
            # Back in office (the key was taken over or expired) with a fresh epoch.
            await a.wait_for("leader", within=5)
            assert a.epochs == [1, 2]
            await stop_all(a)

    with run_redis(appendonly=True) as server:
        asyncio.run(scenario(server.url, server.kill, server.restart))


def test_a_fenced_leader_steps_down_and_stands_again_with_a_newer_epoch() -> None:
    async def scenario(url: str) -> None:
        async with redis_client(url) as ra, redis_client(url) as rs:
            a = Running(elector(ra, "a")).start()
            await a.wait_for("leader")
            store = metadata_store(rs)
            # Someone took an epoch behind the leader's back (e.g. a stale Kubernetes winner's late INCR).
            await rs.incr(epoch_key(PREFIX))
            with pytest.raises(NotCoordinator):
                await store.write(a.epochs[0], [new_cluster_record(1, 0, 0)])
            a.elector.fenced()  # what the service layer does on that NotCoordinator
            assert not a.elector.is_leader(), "refuses requests at once"
            await a.wait_for("lost:1", within=2)
            await a.wait_for("leader", within=3)
            assert a.epochs == [1, 3]
            await store.write(a.epochs[-1], [new_cluster_record(1, 0, 0)])
            await stop_all(a)

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


def test_three_electors_racing_for_a_free_lease_elect_exactly_one() -> None:
    async def scenario(url: str) -> None:
        async with redis_client(url) as r:
            runs = [Running(elector(r, f"c{i}")).start() for i in range(3)]
            await asyncio.sleep(0.5)
            leaders = [x for x in runs if x.elector.is_leader()]
            assert len(leaders) == 1
            assert sum(len(x.epochs) for x in runs) == 1
            for x in runs:
                assert x.elector.leader() == leaders[0].elector.leader()
            await stop_all(*runs)

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


# ---- the Lua scripts, directly -----------------------------------------------------------------------------


def test_lease_store_scripts_compare_before_they_write() -> None:
    async def scenario(url: str) -> None:
        async with redis_client(url) as r:
            store = RedisLeaseStore(r, PREFIX)
            a = Candidate("a", "a:1", 2.0)
            won, rec = await store.acquire(None, a)
            assert won
            assert rec is not None
            assert (rec.holder, rec.address, rec.epoch, rec.duration) == (
                "a",
                "a:1",
                1,
                2.0,
            )
            assert 1500 < await r.pttl(store.leader_key) <= 2000
            # Somebody else: the key exists, so no (and no new epoch).
            won, seen = await store.acquire(None, Candidate("b", "b:1", 2.0))
            assert not won
            assert seen == rec
            won, _ = await store.acquire(
                LeaseRecord("x", "x:1", 9, 2.0, "not-the-value"), Candidate("b", "b:1", 2)
            )
            assert not won
            epoch = await r.get(store.epoch_key)
            assert epoch is not None
            assert int(epoch) == 1
            # Renew: only the same identity *and* epoch.
            ok, _ = await store.renew(LeaseRecord("a", "a:1", 5, 2.0, rec.version))
            assert not ok
            ok, renewed = await store.renew(rec)
            assert ok
            assert renewed is not None
            assert renewed.version != rec.version
            assert json.loads(renewed.version)["renewals"] == 1
            # Release: not by a stranger; by the holder, yes.
            await store.release(LeaseRecord("b", "b:1", 1, 2.0, ""))
            assert await store.read() is not None
            await store.release(renewed)
            assert await store.read() is None
            # Take over a specific record (compare-and-set on its exact value).
            won, rec2 = await store.acquire(None, a)
            assert won
            assert rec2 is not None
            won, rec3 = await store.acquire(rec2, Candidate("b", "b:1", 2.0))
            assert won
            assert rec3 is not None
            assert rec3.holder == "b"
            assert rec3.epoch == 3

            await r.set(store.leader_key, "{not json")
            with pytest.raises(StorageError, match="corrupt"):
                await store.read()

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


def test_an_unreachable_redis_is_a_storage_error() -> None:
    async def scenario() -> None:
        async with unreachable_redis() as r:
            store = RedisLeaseStore(r, PREFIX)
            with pytest.raises(StorageError):
                await store.read()
            with pytest.raises(StorageError):
                await store.acquire(None, Candidate("a", "a:1", 1.0))

    asyncio.run(scenario())
