"""The Spark source's streaming offsets with leader epochs (``spark/epochs.py``): the new form round
trips, and offsets checkpointed before epochs (plain numbers) still load, without an epoch."""

from __future__ import annotations

import json

import pytest

from sluice.errors import InvalidArgument
from sluice.spark.epochs import join_offsets, split_offsets

#: An offsets file's last line as a query checkpointed it before leader epochs.
OLD_CHECKPOINT = '{"orders/0":1200,"orders/1":980}'


def test_an_offset_checkpointed_before_epochs_loads_without_them() -> None:
    offsets, epochs = split_offsets(json.loads(OLD_CHECKPOINT))
    assert offsets == {"orders/0": 1200, "orders/1": 980}
    assert epochs == {}  # not checked, as before


def test_offsets_with_epochs_round_trip_through_json() -> None:
    joined = join_offsets({"orders/0": 1200, "orders/1": 980}, {"orders/0": 4})
    text = json.dumps(joined)
    assert json.loads(text) == {"orders/0": {"offset": 1200, "leaderEpoch": 4}, "orders/1": 980}
    assert split_offsets(json.loads(text)) == ({"orders/0": 1200, "orders/1": 980}, {"orders/0": 4})


def test_a_mixed_offset_loads() -> None:
    """A partition added while the query ran may have no epoch yet next to ones that have."""
    raw = {"t/0": {"offset": 5, "leaderEpoch": 0}, "t/1": 7, "t/2": {"offset": 9}}
    assert split_offsets(raw) == ({"t/0": 5, "t/1": 7, "t/2": 9}, {"t/0": 0})


@pytest.mark.parametrize("value", ["12", True, None, {"leaderEpoch": 3}, {"offset": "1"}, [1, 2]])
def test_a_malformed_offset_is_refused(value: object) -> None:
    with pytest.raises(InvalidArgument, match="t/0"):
        split_offsets({"t/0": value})
