"""The Lease elector: its logic over the pure machine, against an in-memory fake of the Kubernetes API
(lease_api_fake.py; no cluster can run here) and a real private Redis for the fencing epoch."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest
from redis.asyncio import Redis

from sluice.coordinator.cluster.records import new_cluster_record
from sluice.coordinator.election.base import Candidate
from sluice.coordinator.election.kubernetes_elector import (
    ADDRESS_ANNOTATION,
    EPOCH_ANNOTATION,
    KubernetesLeaseElector,
    LeaseStoreK8s,
    micro_time,
)
from sluice.coordinator.election.machine import ElectionTiming
from sluice.coordinator.state import CoordinatorState
from sluice.coordinator.store import MetadataStore
from sluice.errors import NotCoordinator, StorageError
from tests.harness import run_redis
from tests.unit.election.electors import FAST, Running, redis_client, stop_all, unreachable_redis
from tests.unit.election.lease_api_fake import FakeLeaseApi

NS, NAME, PREFIX = "sluice", "sluice-coordinator", "t"


def elector(
    api: FakeLeaseApi, redis: Redis, name: str, timing: ElectionTiming = FAST
) -> KubernetesLeaseElector:
    return KubernetesLeaseElector(api, NAME, NS, redis, PREFIX, name, f"10.0.0.{name[-1]}:7600", timing)


def test_one_leader_on_the_lease_the_standby_takes_over_and_the_old_epoch_is_fenced() -> None:
    async def scenario(url: str) -> None:
        api = FakeLeaseApi()
        async with redis_client(url) as r:
            a = Running(elector(api, r, "pod-1")).start()
            await a.wait_for("leader")
            b = Running(elector(api, r, "pod-2")).start()
            await b.wait_for("follower")

            lease = api.lease(NS, NAME)
            assert lease.spec.holder_identity == "pod-1"
            assert lease.spec.lease_duration_seconds == 1
            assert lease.spec.lease_transitions == 0
            assert lease.metadata.annotations == {ADDRESS_ANNOTATION: "10.0.0.1:7600", EPOCH_ANNOTATION: "1"}
            assert a.epochs == [1]
            info = b.elector.leader()
            assert info is not None
            assert (info.identity, info.address, info.epoch) == (
                "pod-1",
                "10.0.0.1:7600",
                1,
            )
            await asyncio.sleep(1.5)
            assert a.elector.is_leader(), "renewals keep it"

            await a.crash()
            killed = time.monotonic()
            await b.wait_for("leader", within=4)
            assert time.monotonic() - killed <= FAST.lease_duration + 2 * FAST.retry_period + 0.6
            lease = api.lease(NS, NAME)
            assert lease.spec.holder_identity == "pod-2"
            assert lease.spec.lease_transitions == 1
            assert lease.metadata.annotations[EPOCH_ANNOTATION] == "2"
            assert b.epochs == [2]

            store = MetadataStore(r, PREFIX, CoordinatorState().codec)
            with pytest.raises(NotCoordinator):
                await store.write(a.epochs[0], [new_cluster_record(1, 0, 0)])
            await store.write(b.epochs[0], [new_cluster_record(1, 0, 0)])
            await stop_all(b)

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


def test_a_conflict_on_replace_means_someone_else_won() -> None:
    async def scenario(url: str) -> None:
        api = FakeLeaseApi()
        async with redis_client(url) as r:
            first = LeaseStoreK8s(api, NAME, NS, r, PREFIX)
            won, held = await first.acquire(None, Candidate("old", "10.0.0.9:7600", 1.0))
            assert won
            assert held is not None
            # Two candidates both read the (expired) lease at the same resourceVersion ...
            s1, s2 = LeaseStoreK8s(api, NAME, NS, r, PREFIX), LeaseStoreK8s(api, NAME, NS, r, PREFIX)
            seen1, seen2 = await s1.read(), await s2.read()
            assert seen1 == seen2 == held
            # ... and both replace with it: the second gets 409 Conflict and does not lead.
            won1, rec1 = await s1.acquire(seen1, Candidate("c1", "10.0.0.1:7600", 1.0))
            won2, rec2 = await s2.acquire(seen2, Candidate("c2", "10.0.0.2:7600", 1.0))
            assert won1
            assert rec1 is not None
            assert rec1.holder == "c1"
            assert rec1.transitions == 1
            assert (won2, rec2) == (False, None)
            epoch = await r.get(f"{PREFIX}:coordinator:epoch")
            assert epoch is not None
            assert int(epoch) == 2, "the loser took no epoch"
            # Creating a Lease that exists is a conflict too.
            s3 = LeaseStoreK8s(api, NAME, NS, r, PREFIX)
            assert await s3.acquire(None, Candidate("c3", "10.0.0.3:7600", 1.0)) == (False, None)

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


def test_a_renewal_that_went_through_unseen_is_not_mistaken_for_a_lost_lease() -> None:
    async def scenario(url: str) -> None:
        api = FakeLeaseApi()
        async with redis_client(url) as r:
            store = LeaseStoreK8s(api, NAME, NS, r, PREFIX)
            won, held = await store.acquire(None, Candidate("me", "10.0.0.1:7600", 1.0))
            assert won
            assert held is not None
            # Our earlier renewal timed out on our side but reached the API server: new resourceVersion,
            # same holder and epoch.
            api.overwrite(NS, NAME, renew_time=micro_time(dt.datetime.now(dt.UTC)))
            ok, renewed = await store.renew(held)
            assert ok
            assert renewed is not None
            assert renewed.version != held.version
            # But a Lease that another holder took is lost.
            api.overwrite(NS, NAME, holder_identity="thief")
            ok, now = await store.renew(renewed)
            assert not ok
            assert now is not None
            assert now.holder == "thief"

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


def test_losing_the_lease_to_another_holder_steps_down() -> None:
    async def scenario(url: str) -> None:
        api = FakeLeaseApi()
        async with redis_client(url) as r:
            a = Running(elector(api, r, "pod-1")).start()
            await a.wait_for("leader")
            # Another pod (at its own address: one at ours would be our own earlier incarnation, whose
            # lease we take at once) takes the lease.
            api.overwrite(NS, NAME, {ADDRESS_ANNOTATION: "10.0.0.9:7600"}, holder_identity="pod-9")
            await a.wait_for("lost:1", within=2)
            assert not a.elector.is_leader()
            leader = a.elector.leader()
            assert leader is not None
            assert leader.identity == "pod-9"
            await stop_all(a)

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


def test_an_unreachable_api_server_makes_the_leader_step_down_in_time_then_it_recovers() -> None:
    async def scenario(url: str) -> None:
        api = FakeLeaseApi()
        async with redis_client(url) as r:
            a = Running(elector(api, r, "pod-1")).start()
            await a.wait_for("leader")
            api.fail_next = 10**6
            await asyncio.sleep(FAST.renew_deadline + 0.02)
            assert not a.elector.is_leader(), "still leading past the renew deadline"
            await a.wait_for("lost:1", within=3)
            assert a.elector.leader() is None
            api.fail_next = 0
            # Its own Lease, at its own address: taken over at once with a new epoch.
            await a.wait_for("leader", within=3)
            assert a.epochs == [1, 2]
            await stop_all(a)

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


def test_resign_releases_the_lease_like_client_go() -> None:
    slow = ElectionTiming(lease_duration=5.0, renew_deadline=3.0, retry_period=0.1)

    async def scenario(url: str) -> None:
        api = FakeLeaseApi()
        async with redis_client(url) as r:
            a = Running(elector(api, r, "pod-1", slow)).start()
            await a.wait_for("leader")
            b = Running(elector(api, r, "pod-2", slow)).start()
            await b.wait_for("follower")
            await a.elector.resign()
            released = api.lease(NS, NAME)
            assert released.spec.holder_identity in (None, "pod-2")
            start = time.monotonic()
            await b.wait_for("leader", within=2)
            assert time.monotonic() - start < 1.0, "no waiting out the 5 s lease"
            assert api.lease(NS, NAME).spec.lease_transitions == 1
            await stop_all(b)

    with run_redis(appendonly=False) as server:
        asyncio.run(scenario(server.url))


def test_redis_down_after_winning_the_lease_gives_it_back() -> None:
    async def scenario() -> None:
        api = FakeLeaseApi()
        async with unreachable_redis() as r:
            store = LeaseStoreK8s(api, NAME, NS, r, PREFIX)
            with pytest.raises(StorageError, match="cannot take an epoch"):
                await store.acquire(None, Candidate("me", "10.0.0.1:7600", 1.0))
            assert api.lease(NS, NAME).spec.holder_identity is None, "released: no leader without an epoch"

    asyncio.run(scenario())


def test_api_errors_other_than_404_and_409_are_storage_errors() -> None:
    async def scenario() -> None:
        api = FakeLeaseApi()
        async with unreachable_redis() as r:
            store = LeaseStoreK8s(api, NAME, NS, r, PREFIX)
            assert await store.read() is None  # 404: no Lease yet
            api.fail_next, api.fail_status = 1, 403
            with pytest.raises(StorageError, match="403"):
                await store.read()

    asyncio.run(scenario())


def test_lease_times_always_carry_six_fractional_digits() -> None:
    whole = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert micro_time(whole).isoformat() == "2030-01-02T03:04:05.000001+00:00"
    with_micros = whole.replace(microsecond=120000)
    assert micro_time(with_micros) == with_micros

    async def scenario() -> None:
        api = FakeLeaseApi()
        async with unreachable_redis() as r:
            store = LeaseStoreK8s(api, NAME, NS, r, PREFIX, wall=lambda: whole)
            # The fake rejects what the API server would; an acquire at a whole second must still pass
            # the create (it then fails on the unreachable Redis - beside the point here).
            with pytest.raises(StorageError, match="epoch"):
                await store.acquire(None, Candidate("me", "10.0.0.1:7600", 1.0))
            assert api.calls[:1] == ["create"]

    asyncio.run(scenario())
