"""A Client's memory_limit (``client/memory.py``) and the push flow control's ``held`` state."""

from __future__ import annotations

import threading

import pytest

from sluice.client.memory import ClientMemory
from sluice.client.push.flow import FlowControl


def test_full_registers_a_wake_up_run_on_the_memory_thread_once_there_is_room() -> None:
    memory = ClientMemory(100)
    assert not memory.full("a", lambda: None)
    memory.add(100)
    woken = threading.Event()
    threads: list[str] = []

    def wake() -> None:
        threads.append(threading.current_thread().name)
        woken.set()

    assert memory.full("a", wake)
    assert memory.full("a", wake)  # asked twice, counted and woken once
    assert memory.stops == 1
    memory.release(1)
    assert woken.wait(5)
    assert threads == ["sluice-memory-waker"]  # never on the releasing thread (its lock is held)
    assert memory.used == 99
    assert memory.peak == 100


def test_a_forgotten_consumer_is_not_woken() -> None:
    memory = ClientMemory(10)
    memory.add(10)
    woken: list[str] = []
    assert memory.full("gone", lambda: woken.append("gone"))
    memory.forget("gone")
    done = threading.Event()
    assert memory.full("here", done.set)
    memory.release(10)
    assert done.wait(5)
    assert woken == []


def test_unlimited_never_full() -> None:
    memory = ClientMemory(0)
    memory.add(1 << 40)
    assert not memory.full("a", lambda: None)


def test_bad_limits_are_refused() -> None:
    for bad in (-1, 1.5, True, "1MiB"):
        with pytest.raises(ValueError, match="memory_limit"):
            ClientMemory(bad)  # type: ignore[arg-type]


def test_held_flow_grants_nothing_until_unheld() -> None:
    flow = FlowControl(4, ["s"])
    assert flow.on_subscribed("s") == [("s", 4)]
    flow.on_delivered("s", 4)
    flow.held = True
    assert flow.on_taken("s") == []
    assert flow.on_taken("s") == []  # the threshold (2) is reached, but memory is held
    flow.pause()
    assert flow.unhold() == []  # still paused by the application
    assert flow.resume(False) == [("s", 2)]
    flow.held = True
    assert flow.on_taken("s") == []
    assert flow.on_taken("s") == []
    assert flow.resume(False) == []  # the application resumes, memory still held
    assert flow.unhold() == [("s", 2)]
