"""The scheduler waits for a cluster that is not reachable yet at start-up (bounded), and gives up at once
on an error that retrying cannot fix."""

from __future__ import annotations

import threading

import pytest

from sluice.broker.schedule import main as scheduler_main
from sluice.errors import BrokerNotAvailable, InvalidArgument


def test_start_up_retries_an_unreachable_cluster_then_goes_on() -> None:
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise BrokerNotAvailable("connection refused")

    scheduler_main._until_reachable(step, threading.Event())
    assert len(calls) == 3


def test_start_up_gives_up_at_once_on_a_non_retriable_error_and_when_stopped() -> None:
    calls: list[int] = []

    def refused() -> None:
        calls.append(1)
        raise InvalidArgument("bad replication factor")

    with pytest.raises(InvalidArgument):
        scheduler_main._until_reachable(refused, threading.Event())
    assert len(calls) == 1

    stopped = threading.Event()
    stopped.set()

    def unreachable() -> None:
        raise BrokerNotAvailable("connection refused")

    with pytest.raises(BrokerNotAvailable):
        scheduler_main._until_reachable(unreachable, stopped)


def test_start_up_waits_no_longer_than_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_main, "STARTUP_WAIT_S", 0.5)
    calls: list[int] = []

    def unreachable() -> None:
        calls.append(1)
        raise BrokerNotAvailable("connection refused")

    with pytest.raises(BrokerNotAvailable):
        scheduler_main._until_reachable(unreachable, threading.Event())
    assert 1 <= len(calls) <= 4
