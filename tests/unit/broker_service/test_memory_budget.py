"""The broker's byte budgets (``broker/memory.py``, docs/memory.md "Broker"): FIFO grants, a
request over the whole budget served alone, cancellation taking nothing, room listeners."""

from __future__ import annotations

import asyncio

import pytest

from sluice.broker.memory import ByteBudget


def test_grants_in_fifo_order_as_bytes_are_released() -> None:
    pool = ByteBudget("test-fifo", 100)
    assert pool.try_take(60)
    assert not pool.try_take(50)
    order: list[str] = []
    pool.wait(50, lambda: order.append("a"))
    pool.wait(10, lambda: order.append("b"))
    # b would fit now, but a waits ahead of it: no overtaking (a large request never starves).
    assert not pool.try_take(10)
    assert order == []
    pool.release(60)
    assert order == ["a", "b"]
    assert pool.used == 60
    assert pool.paused == 2


def test_a_request_larger_than_the_budget_is_served_alone() -> None:
    pool = ByteBudget("test-large", 100)
    assert pool.try_take(10)
    granted: list[int] = []
    pool.wait(500, lambda: granted.append(500))
    assert granted == []
    pool.release(10)
    assert granted == [500]
    assert pool.used == 500
    assert not pool.has_room
    pool.release(500)
    assert pool.has_room
    assert pool.try_take(500)  # alone again: granted at once


def test_unlimited_only_counts() -> None:
    pool = ByteBudget("test-unlimited", 0)
    assert pool.try_take(1 << 40)
    assert pool.try_take(1 << 40)
    assert pool.has_room
    assert pool.peak == 2 << 40


def test_a_cancelled_take_takes_nothing() -> None:
    async def main() -> None:
        pool = ByteBudget("test-cancel", 100)
        await pool.take(100)
        waiting = asyncio.create_task(pool.take(50))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        pool.release(100)
        assert pool.used == 0
        await asyncio.wait_for(pool.take(100), 1)
        assert pool.used == 100

    asyncio.run(main())


def test_cancelled_waiter_lets_the_next_one_through() -> None:
    pool = ByteBudget("test-cancel-next", 100)
    assert pool.try_take(100)
    got: list[str] = []
    first = pool.wait(100, lambda: got.append("first"))
    pool.wait(10, lambda: got.append("second"))
    pool.release(50)
    assert got == []  # first (100) does not fit in 50 and blocks second
    pool.cancel(first)
    assert got == ["second"]


def test_room_listeners_hear_when_the_pool_has_room_again() -> None:
    pool = ByteBudget("test-room", 100)
    assert pool.try_take(100)
    heard: list[int] = []
    pool.room_listeners.add(lambda: heard.append(pool.used))
    pool.release(40)
    assert heard == [60]
