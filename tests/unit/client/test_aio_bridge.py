"""The pieces sluice.aio stands on, without a cluster: the wakeable condition, the loop bridge, the
one-call-at-a-time Serial (a cancelled worker-thread call still finishes before the next starts) and the
async-callback bridge of the consumer config."""

from __future__ import annotations

import asyncio
import functools
import threading
import time

from sluice.aio.bridge import LoopBridge, Serial, resolve
from sluice.aio.consumer import bridge_callbacks
from sluice.client.consumer import ConsumerConfig
from sluice.client.wakers import WakeableCondition


def test_notify_and_notify_all_call_each_waker_once() -> None:
    cond = WakeableCondition(threading.RLock())
    calls: list[str] = []
    with cond:
        cond.add_waker(lambda: calls.append("a"))
        cond.notify()
        cond.notify_all()
        assert calls == ["a", "a"]
        cond.remove_waker(lambda: None)  # unknown: ignored
    # A thread waiting on the condition is still woken as by a plain Condition.
    woke = threading.Event()

    def waiter() -> None:
        with cond:
            if cond.wait(5):
                woke.set()

    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 5
    while not woke.is_set() and time.monotonic() < deadline:
        with cond:
            cond.notify_all()
        woke.wait(0.01)
    t.join(5)
    assert woke.is_set()


def test_a_waker_resolves_an_asyncio_future_from_another_thread() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        bridge = LoopBridge(loop)
        cond = WakeableCondition()
        fut: asyncio.Future[None] = loop.create_future()
        with cond:
            cond.add_waker(lambda: bridge.post(lambda: resolve(fut)))
        started = time.monotonic()

        def notify() -> None:
            with cond:
                cond.notify_all()

        threading.Timer(0.05, notify).start()
        await asyncio.wait_for(fut, 5)
        return time.monotonic() - started

    assert asyncio.run(main()) < 5


def test_the_bridge_runs_a_burst_in_one_loop_wakeup_and_in_order() -> None:
    async def main() -> list[int]:
        bridge = LoopBridge(asyncio.get_running_loop())
        got: list[int] = []
        done = asyncio.Event()

        def burst() -> None:
            for i in range(1000):
                bridge.post(functools.partial(got.append, i))
            bridge.post(done.set)

        t = threading.Thread(target=burst)
        t.start()
        await asyncio.wait_for(done.wait(), 5)
        t.join()
        return got

    assert asyncio.run(main()) == list(range(1000))


def test_serial_waits_for_a_cancelled_callers_thread_before_the_next_call() -> None:
    events: list[str] = []
    started, release = threading.Event(), threading.Event()

    def slow() -> None:
        events.append("slow start")
        started.set()
        release.wait(5)
        events.append("slow end")

    def quick() -> None:
        events.append("quick")

    async def main() -> None:
        serial = Serial()
        task = asyncio.create_task(serial.run(slow))
        assert await asyncio.to_thread(started.wait, 5)
        task.cancel()
        next_call = asyncio.create_task(serial.run(quick))
        await asyncio.sleep(0.05)
        assert events == ["slow start"]  # the quick call waits: the slow one is still running
        release.set()
        await asyncio.wait_for(next_call, 5)

    asyncio.run(main())
    assert events == ["slow start", "slow end", "quick"]


def test_async_callbacks_are_run_on_the_loop_and_awaited_by_the_calling_thread() -> None:
    seen: list[tuple[str, list[tuple[str, int]], bool]] = []

    async def on_assign(parts: list[tuple[str, int]]) -> None:
        await asyncio.sleep(0.01)
        seen.append(("assign", parts, threading.current_thread() is threading.main_thread()))

    class Listener:
        async def on_revoke(self, parts: list[tuple[str, int]]) -> None:
            seen.append(("revoke", parts, threading.current_thread() is threading.main_thread()))

    def on_lost(parts: list[tuple[str, int]]) -> None:  # a plain function stays as it is
        seen.append(("lost", parts, False))

    async def main() -> None:
        cfg = bridge_callbacks(
            ConsumerConfig(on_assign=on_assign, listener=Listener(), on_lost=on_lost),
            asyncio.get_running_loop(),
        )
        assert cfg.on_lost is on_lost
        assign, revoke = cfg.callback("on_assign"), cfg.callback("on_revoke")
        assert assign is not None
        assert revoke is not None
        # Called from a worker thread (as the consumer's poll step is): it returns after the coroutine.
        await asyncio.to_thread(assign, [("t", 0)])
        assert seen == [("assign", [("t", 0)], True)]
        await asyncio.to_thread(revoke, [("t", 1)])
        assert seen[-1] == ("revoke", [("t", 1)], True)

    asyncio.run(main())
