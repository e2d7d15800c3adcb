"""``common/timeouts.within``: a deadline that never loses an outside cancellation (Python 3.11's
``asyncio.wait_for`` does, CPython gh-86296), and the rule that the services use it, not ``wait_for``."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from sluice.common.timeouts import within

SERVICES = Path(__file__).resolve().parents[2] / "services" / "sluice"


async def _cancel_as_the_event_is_set(spins: int) -> bool:
    """A loop waiting on an event with a deadline is cancelled ``spins`` loop passes after the event was
    set (while the wait's completion is on its way): whether the loop ended."""
    event = asyncio.Event()

    async def loop() -> None:
        for _ in range(1_000):  # bounded: a swallowed cancellation would spin here
            await within(event.wait(), 10)
            event.clear()

    task = asyncio.create_task(loop())
    for _ in range(3):
        await asyncio.sleep(0)
    event.set()
    for _ in range(spins):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=1)
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return bool(done)


@pytest.mark.parametrize("spins", range(4))
def test_a_cancellation_that_meets_a_completed_wait_ends_the_task(spins: int) -> None:
    # With asyncio.wait_for in `loop`, spins 0-2 leave the task running on Python 3.11.
    assert asyncio.run(_cancel_as_the_event_is_set(spins))


def test_within_returns_the_result_or_times_out() -> None:
    async def run() -> None:
        assert await within(asyncio.sleep(0, result=7), 1) == 7
        with pytest.raises(TimeoutError):
            await within(asyncio.Event().wait(), 0.01)

    asyncio.run(run())


def test_the_services_await_deadlines_through_within() -> None:
    offenders = [
        f"{path.relative_to(SERVICES)}:{n}"
        for path in sorted(SERVICES.rglob("*.py"))
        if path.name != "timeouts.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\basyncio\.wait_for\(|\bfrom asyncio import .*\bwait_for\b", line)
    ]
    assert not offenders, f"use common.timeouts.within (wait_for drops cancellations): {offenders}"
