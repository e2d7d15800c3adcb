"""The user store on a real Redis: what it keeps (never the password), generations across delete and
re-create, the version every change bumps, the change listener."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from sluice.coordinator.users import UserStore
from sluice.security.scram import make_credential
from tests.harness import RedisServer


def test_store_keeps_credentials_and_generations(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        redis = Redis.from_url(redis_server.url)
        store = UserStore(redis, "store-test")
        changes: list[int] = []
        store.on_change(lambda: changes.append(1))
        try:
            v0 = await store.version()
            assert await store.upsert("kim", make_credential("kims-password", 4096)) == (1, True)
            assert await store.upsert("lee", make_credential("lees-password", 4096)) == (1, True)
            assert await store.upsert("kim", make_credential("new-password", 4096)) == (2, False)
            assert await store.delete("lee") == 2
            assert await store.delete("lee") is None  # nothing changed: no listener call, no version bump
            snapshot = await store.snapshot()
            assert snapshot.generations == {"kim": 2}
            assert snapshot.version == v0 + 4 == await store.version()
            assert len(changes) == 4
            assert await store.upsert("lee", make_credential("again", 4096)) == (
                3,
                True,
            )  # past the tombstone
            assert await store.generations() == {"kim": 2, "lee": 3}
            record = await store.login_record("kim")
            assert record is not None
            assert record.generation == 2
            assert record.credential.iterations == 4096
            assert await store.login_record("nobody") is None
            assert [u.name for u in await store.list_users()] == ["kim", "lee"]
            raw: dict[bytes, bytes] = await redis.hgetall("store-test:users")  # type: ignore[assignment]
            everything = b"".join(k + v for k, v in raw.items())
            for password in (b"kims-password", b"new-password", b"again"):
                assert password not in everything
        finally:
            await redis.aclose()

    asyncio.run(scenario())
