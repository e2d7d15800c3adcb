"""FetchDriver: one thread steps every prefetcher of a Client when woken or when its backoff ends.

The steppables here are plain recorders (the driver only needs ``queued`` and ``step``); the real
prefetcher over a real broker is exercised by tests/integration/consumer (test_shared_connection.py
runs 100 consumers on one driver).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sluice.client.consumer.fetch_driver import FetchDriver


class Recorder:
    """Counts its steps; a step may block on ``gate`` and asks to be stepped again after ``again``."""

    def __init__(self, again: float | None = None, gate: threading.Event | None = None) -> None:
        self.queued = False
        self.again = again
        self.gate = gate
        self.steps: list[float] = []
        self.stepped = threading.Event()

    def step(self) -> float | None:
        self.steps.append(time.monotonic())
        self.stepped.set()
        if self.gate is not None:
            self.gate.wait(5)
        return self.again


def _wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def test_a_burst_of_wake_ups_queues_one_step() -> None:
    driver = FetchDriver()
    gate = threading.Event()
    blocker, p = Recorder(gate=gate), Recorder()
    try:
        driver.wake(blocker)
        assert blocker.stepped.wait(5)  # the driver's thread is busy in the blocker's step
        for _ in range(100):
            driver.wake(p)
        gate.set()
        assert _wait_for(lambda: len(p.steps) == 1)
        time.sleep(0.05)
        assert len(p.steps) == 1
        # Woken again after its step: stepped again.
        driver.wake(p)
        assert _wait_for(lambda: len(p.steps) == 2)
    finally:
        gate.set()
        driver.close()


def test_a_step_that_asks_is_stepped_again_after_its_backoff_without_a_wake_up() -> None:
    driver = FetchDriver()
    backing_off, idle = Recorder(again=0.05), Recorder(again=None)
    try:
        driver.wake(backing_off)
        driver.wake(idle)
        assert _wait_for(lambda: len(backing_off.steps) >= 3)
        gaps = [b - a for a, b in zip(backing_off.steps, backing_off.steps[1:], strict=False)]
        assert min(gaps) >= 0.045, gaps
        assert len(idle.steps) == 1  # None: only when woken
    finally:
        driver.close()


def test_one_step_failing_does_not_stop_the_others() -> None:
    class Broken(Recorder):
        def step(self) -> float | None:
            super().step()
            raise RuntimeError("a bug in one prefetcher")

    driver = FetchDriver()
    broken, fine = Broken(), Recorder()
    try:
        driver.wake(broken)
        driver.wake(fine)
        assert _wait_for(lambda: len(fine.steps) == 1)
        driver.wake(broken)
        driver.wake(fine)
        assert _wait_for(lambda: len(fine.steps) == 2 and len(broken.steps) == 2)
    finally:
        driver.close()


def test_the_thread_starts_with_the_first_wake_up_and_ends_on_close() -> None:
    before = threading.active_count()
    driver = FetchDriver(name="test-fetch-driver")
    assert threading.active_count() == before  # nothing to run yet
    p = Recorder()
    driver.wake(p)
    assert p.stepped.wait(5)
    assert any(t.name == "test-fetch-driver" for t in threading.enumerate())
    driver.close()
    assert not any(t.name == "test-fetch-driver" for t in threading.enumerate())
