"""Awaiting with a deadline, without Python 3.11's ``asyncio.wait_for`` losing a cancellation.

In Python 3.11 (our floor), ``asyncio.wait_for`` swallows an outside ``cancel()`` that arrives once the
awaited thing has completed but before ``wait_for`` resumed: it returns the result instead (CPython
gh-86296, fixed in 3.12 by building ``wait_for`` on ``asyncio.timeout``). A loop such as ``while True:
await wait_for(event.wait(), t)`` then never ends: cancelled while its event was being set, it goes round
again, and nothing cancels it a second time. The coordinator's group timer did exactly that at shutdown,
so a coordinator stopped with members heartbeating sometimes never exited (the suite's
``test_a_coordinator_stops_at_once_with_streams_open``, 3 failures in 10 runs under load).
``asyncio.timeout`` counts cancellations (``Task.uncancel``) and re-raises an outside one, so
:func:`within` is the one way the services await with a deadline (a unit test keeps ``wait_for`` out).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["within"]

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """``awaitable``'s result, or ``TimeoutError`` once ``seconds`` passed (it is cancelled then)."""
    async with asyncio.timeout(seconds):
        return await awaitable
