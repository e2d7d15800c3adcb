"""JwksCache's rate limit, shared fetches, failure handling and key removal, with an in-process fetch
function (the HTTP fetcher is exercised against a real server in tests/integration/security)."""

from __future__ import annotations

import asyncio
import threading

from sluice.security.jwks import JwksCache
from tests.jwt_tokens import jwk, jwks, rsa_key


class _Source:
    """A JWKS document that tests change, served by a blocking fetch that counts its calls."""

    def __init__(self, document: bytes) -> None:
        self.document = document
        self.calls = 0
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()

    def fetch(self) -> bytes:
        self.calls += 1
        assert self.gate.wait(5)
        if self.fail:
            raise OSError("connection refused")
        return self.document


def _cache(source: _Source, now: list[float], max_age: float = 600.0) -> JwksCache:
    return JwksCache(source.fetch, refetch_interval=10.0, max_age=max_age, clock=lambda: now[0])


def test_unknown_kids_refetch_at_most_once_per_interval() -> None:
    source = _Source(jwks(jwk(rsa_key(), "k1")))
    now = [0.0]
    cache = _cache(source, now)

    async def scenario() -> None:
        assert [k.kid for k in await cache.find("k1")] == ["k1"]
        for n in range(200):
            assert await cache.find(f"made-up-{n}") == []
        assert source.calls == 1  # the first load at t=0: no refetch allowed before t=10
        now[0] = 9.0
        assert await cache.find("made-up-again") == []
        assert source.calls == 1
        now[0] = 10.5
        for n in range(200):
            assert await cache.find(f"made-up-{n}") == []
        assert source.calls == 2

    asyncio.run(scenario())


def test_concurrent_callers_share_one_fetch() -> None:
    source = _Source(jwks(jwk(rsa_key(), "k1")))
    source.gate.clear()
    cache = _cache(source, [0.0])

    async def scenario() -> None:
        waiting = [asyncio.ensure_future(cache.find(f"kid-{n}")) for n in range(50)]
        await asyncio.sleep(0.05)
        source.gate.set()
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        assert source.calls == 1

    asyncio.run(scenario())


def test_a_failed_fetch_keeps_the_keys_held_and_is_reported() -> None:
    source = _Source(jwks(jwk(rsa_key(), "k1")))
    now = [0.0]
    cache = _cache(source, now)

    async def scenario() -> None:
        await cache.find("k1")
        source.fail = True
        now[0] = 20.0
        assert await cache.find("k2") == []
        assert "connection refused" in cache.last_error
        assert [k.kid for k in await cache.find("k1")] == ["k1"]

    asyncio.run(scenario())


def test_a_removed_key_bumps_the_revision_and_a_stale_set_refreshes_in_the_background() -> None:
    source = _Source(jwks(jwk(rsa_key(), "k1"), jwk(rsa_key("b"), "k2")))
    now = [0.0]
    cache = _cache(source, now, max_age=60.0)

    async def scenario() -> None:
        await cache.find("k1")
        source.document = jwks(jwk(rsa_key("b"), "k2"))
        now[0] = 61.0
        # Stale: answered from the held keys at once, a refetch starts behind the answer.
        assert [k.kid for k in await cache.find("k1")] == ["k1"]
        for _ in range(100):
            if source.calls == 2 and cache.revision == 1:
                break
            await asyncio.sleep(0.01)
        assert cache.revision == 1
        assert await cache.find("k1") == []

    asyncio.run(scenario())


def test_a_token_without_kid_sees_every_key() -> None:
    source = _Source(jwks(jwk(rsa_key(), "k1"), jwk(rsa_key("b"), None)))
    cache = _cache(source, [0.0])
    assert sorted(str(k.kid) for k in asyncio.run(cache.find(None))) == ["None", "k1"]


def test_a_hostile_document_is_a_failed_fetch_not_a_crash() -> None:
    source = _Source(b"[" * 100_000 + b"]" * 100_000)  # json's RecursionError
    cache = _cache(source, [0.0])
    assert asyncio.run(cache.find("k1")) == []
    assert cache.last_error
