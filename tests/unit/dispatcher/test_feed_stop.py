"""A feed stops even when its task loses a cancellation (an await that completes in the same loop turn as
the cancel can drop it, as Python 3.11's wait_for did): a subscription being dropped, and the Subscribe
waiting on that drop, never hang on it."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from sluice.common.peers import AioPeers
from sluice.dispatcher.feed import PartitionFeed


def test_stop_returns_when_the_task_swallowed_a_cancellation() -> None:
    async def scenario() -> float:
        swallowed = asyncio.Event()

        async def stubborn() -> None:
            try:
                await asyncio.sleep(100)
            except asyncio.CancelledError:
                swallowed.set()  # lost: the task goes on as if nothing happened
            await asyncio.sleep(100)

        feed = PartitionFeed("t", 0, cast(Any, None), AioPeers(), list, 500, 1 << 20)
        task = asyncio.get_running_loop().create_task(stubborn())
        feed._task = task  # the feed's own task, as start() would make it
        await asyncio.sleep(0)
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(feed.stop(), 10)
        assert swallowed.is_set()
        assert task.cancelled()
        return asyncio.get_running_loop().time() - started

    assert asyncio.run(scenario()) < 3
