"""The push consumer's auto-scaled receive window (PIP-74; ``client/push/flow.py``): on when the Client has
a ``memory_limit``. A queue starts small, grows while the application keeps up and the Client has room,
and shrinks as the Client's memory fills; the share invariant holds throughout."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.client.push.flow import INITIAL_WINDOW, FlowControl


def _flow(share: int, autoscale: bool = True) -> FlowControl:
    flow = FlowControl(share, autoscale=autoscale)
    flow.set_streams(["s"])
    return flow


def test_without_a_memory_limit_the_first_grant_is_the_whole_share() -> None:
    assert _flow(1000, autoscale=False).on_subscribed("s") == [("s", 1000)]


def test_with_one_the_window_starts_small_and_doubles_while_the_application_keeps_up() -> None:
    flow = _flow(1000)
    assert flow.on_subscribed("s") == [("s", INITIAL_WINDOW)]
    windows = []
    for _ in range(8):
        granted = flow.streams["s"].outstanding
        flow.on_delivered("s", granted)
        for _ in range(granted):
            flow.on_taken("s")
        windows.append(flow.streams["s"].window)
    assert windows[:4] == [16, 32, 64, 128]
    assert windows[-1] == 1000  # up to the share, never past it


def test_near_the_limit_deliveries_halve_the_window_and_grants_stay_inside_it() -> None:
    flow = _flow(1000)
    flow.on_subscribed("s")
    flow.streams["s"].window = 512
    flow.near_limit = True
    flow.on_delivered("s", INITIAL_WINDOW)
    assert flow.streams["s"].window == 256
    flow.on_delivered("s", 0)
    assert flow.streams["s"].window == 128
    for _ in range(INITIAL_WINDOW):
        flow.on_taken("s")
    s = flow.streams["s"]
    assert s.outstanding + s.queued <= s.window
    assert s.window == 128  # no growth while near the limit, even with the queue emptied


@given(st.lists(st.sampled_from(["deliver", "take", "near", "room"]), max_size=300), st.integers(1, 300))
def test_the_share_invariant_holds_and_no_grant_exceeds_the_window(ops: list[str], share: int) -> None:
    flow = _flow(share)
    s = flow.streams["s"]
    for key, n in flow.on_subscribed("s"):
        assert key == "s"
        assert n <= s.window
    for op in ops:
        grants = []
        if op == "deliver" and s.outstanding:
            flow.on_delivered("s", s.outstanding)
        elif op == "take" and s.queued:
            grants = flow.on_taken("s")
        elif op == "near":
            flow.near_limit = True
        elif op == "room":
            flow.near_limit = False
        for _, _n in grants:
            assert s.outstanding + s.queued <= s.window  # granted only inside the window
        assert s.outstanding + s.queued + s.taken == share
        assert 1 <= s.window <= share
