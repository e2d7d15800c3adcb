"""HeapKeeper: long-lived objects leave the collector's sight; a complete collection still runs."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sluice.coordinator.heap import HeapKeeper


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_tick_freezes_what_lived_until_now(unfrozen: None) -> None:
    keeper = HeapKeeper(freeze_every_s=0.0, full_every_s=3600.0)
    kept = [[i] for i in range(1000)]  # long-lived containers
    keeper.tick()
    assert gc.get_freeze_count() >= len(kept)


def test_the_complete_collection_unfreezes_collects_cycles_and_freezes_again(unfrozen: None) -> None:
    keeper = HeapKeeper(freeze_every_s=3600.0, full_every_s=0.0)
    cycle: list[object] = []
    cycle.append(cycle)
    gc.freeze()  # the cycle is frozen while still referenced ...
    del cycle  # ... and then becomes garbage the collector cannot see
    frozen_with_cycle = gc.get_freeze_count()
    keeper.tick()
    assert gc.get_freeze_count() < frozen_with_cycle  # the cycle was found and freed
