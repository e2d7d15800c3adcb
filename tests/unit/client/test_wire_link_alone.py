"""``Link.alone``: when a group consumer's ``poll()`` may read its connection itself (docs/latency.md,
"Fourth pass"), and when it must leave its lane to the connection's reader thread."""

from __future__ import annotations

import collections
import math
from collections.abc import Iterator

import pytest

from sluice.client.wire_link import Link, Waiting


@pytest.fixture
def link() -> Iterator[Link]:
    link = Link()
    link.reading = link.thread_reading = False  # connected; nobody reads: the reader thread rests
    yield link
    link.close_interrupts()


def _owe(link: Link, lane: int) -> None:
    link.lanes.setdefault(lane, collections.deque()).append(
        Waiting(1, math.inf, lambda _: None, object(), 1.0, 3)
    )


def test_a_lane_alone_on_its_connection_may_drive(link: Link) -> None:
    _owe(link, 1)
    assert link.alone(1)
    link.produces.append(Waiting(2, math.inf, lambda _: None, object()))
    assert link.alone(1)  # a producer's answers are read by whoever reads


def test_another_lane_the_reader_thread_reads_means_not_alone(link: Link) -> None:
    _owe(link, 1)
    _owe(link, 2)
    assert not link.alone(1)
    link.driven.add(2)  # its owner reads it itself when it waits (away now): the driver reads it too
    assert link.alone(1)


def test_another_owner_reading_or_waiting_to_means_not_alone(link: Link) -> None:
    _owe(link, 1)
    link.drivers = 1
    assert not link.alone(1)
    link.drivers = 0
    link.reading = True  # an owner holds the turn (not the thread)
    assert not link.alone(1)
    link.thread_reading = True  # the reader thread holds it: it hands the turn over
    assert link.alone(1)
