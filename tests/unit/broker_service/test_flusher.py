"""Group commit: one fsync releases every produce that was waiting when it started."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sluice.broker.flusher import Flusher, FlushPolicy
from sluice.errors import InvalidArgument, StorageError


class GatedLog:
    """A flushable whose fsync blocks until the test opens the gate."""

    def __init__(self) -> None:
        self.flushes = 0
        self.started = threading.Event()
        self.gate = threading.Event()
        self.fail = False

    def flush(self) -> None:
        self.started.set()
        self.gate.wait(5)
        self.flushes += 1
        if self.fail:
            raise StorageError("disk on fire")


async def _until(cond: threading.Event) -> None:
    await asyncio.to_thread(cond.wait, 5)


def test_one_fsync_serves_all_waiters_and_latecomers_wait_for_the_next() -> None:
    async def scenario() -> None:
        flusher = Flusher(FlushPolicy.ALWAYS, 1.0)
        flusher.start()
        log = GatedLog()
        flusher.mark_dirty(("t", 0), log)
        early = [asyncio.create_task(flusher.wait_durable()) for _ in range(5)]
        await _until(log.started)  # round 1 is fsyncing
        log.started.clear()
        flusher.mark_dirty(("t", 0), log)
        late = asyncio.create_task(flusher.wait_durable())
        await asyncio.sleep(0.01)
        assert not any(t.done() for t in early)
        log.gate.set()
        await asyncio.gather(*early)
        assert log.flushes >= 1
        await asyncio.wait_for(late, 5)
        # The late waiter needed a round that started after its append: two fsyncs in all,
        # not one per waiter.
        assert log.flushes == 2
        assert flusher.rounds == 2
        await flusher.stop()

    asyncio.run(scenario())


def test_fsync_failure_fails_the_waiters_and_keeps_the_log_dirty() -> None:
    async def scenario() -> None:
        flusher = Flusher(FlushPolicy.ALWAYS, 1.0)
        flusher.start()
        log = GatedLog()
        log.fail = True
        log.gate.set()
        flusher.mark_dirty(("t", 0), log)
        with pytest.raises(StorageError, match="t/0"):
            await flusher.wait_durable()
        log.fail = False
        await flusher.wait_durable()  # retried in the next round
        assert log.flushes == 2
        await flusher.stop()

    asyncio.run(scenario())


def test_interval_and_never_do_not_hold_acks() -> None:
    async def scenario() -> None:
        for policy in (FlushPolicy.INTERVAL, FlushPolicy.NEVER):
            flusher = Flusher(policy, 0.01)
            flusher.start()
            log = GatedLog()
            log.gate.set()
            flusher.mark_dirty(("t", 0), log)
            await asyncio.wait_for(flusher.wait_durable(), 0.5)
            await asyncio.sleep(0.1)
            assert (log.flushes > 0) == (policy is FlushPolicy.INTERVAL)
            await flusher.stop()

    asyncio.run(scenario())


def test_stop_flushes_what_is_dirty() -> None:
    async def scenario() -> None:
        flusher = Flusher(FlushPolicy.INTERVAL, 60)
        flusher.start()
        log = GatedLog()
        log.gate.set()
        flusher.mark_dirty(("t", 0), log)
        await flusher.stop()
        assert log.flushes == 1

    asyncio.run(scenario())


def test_policy_names() -> None:
    assert FlushPolicy.parse(" Always ") is FlushPolicy.ALWAYS
    with pytest.raises(InvalidArgument, match="always, interval or never"):
        FlushPolicy.parse("sometimes")
