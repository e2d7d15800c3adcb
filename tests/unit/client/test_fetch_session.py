"""The client half of incremental fetch sessions (KIP-227)."""

from __future__ import annotations

from sluice.client.fetch_session import FetchSession, PartitionFetchState

A = ("t", 0)
B = ("t", 1)
C = ("u", 0)


def st(offset: int, filt: str = "") -> PartitionFetchState:
    return PartitionFetchState(offset, 1024, filt)


def test_first_request_opens_a_session_with_every_partition() -> None:
    s = FetchSession()
    req = s.build({A: st(0), B: st(5)})
    assert (req.session_id, req.session_epoch, req.full) == (0, 0, True)
    assert req.partitions == {A: st(0), B: st(5)}
    assert req.forgotten == []


def test_incremental_requests_send_only_changes_and_forgotten() -> None:
    s = FetchSession()
    s.on_response(s.build({A: st(0), B: st(5)}), session_id=77)
    req = s.build({A: st(10), B: st(5)})
    assert (req.session_id, req.session_epoch) == (77, 1)
    assert req.partitions == {A: st(10)}
    s.on_response(req, session_id=77)
    req = s.build({A: st(10), C: st(0, "x || y")})
    assert req.session_epoch == 2
    assert req.partitions == {C: st(0, "x || y")}
    assert req.forgotten == [B]
    s.on_response(req, session_id=77)
    # Nothing changed: an empty incremental request (the broker answers what is new).
    req = s.build({A: st(10), C: st(0, "x || y")})
    assert req.partitions == {}
    assert req.forgotten == []
    assert req.session_epoch == 3


def test_filter_change_is_a_change() -> None:
    s = FetchSession()
    s.on_response(s.build({A: st(0)}), session_id=1)
    assert s.build({A: st(0, "a")}).partitions == {A: st(0, "a")}


def test_no_session_from_broker_means_full_fetches() -> None:
    s = FetchSession()
    s.on_response(s.build({A: st(0)}), session_id=0)
    req = s.build({A: st(3)})
    assert req.full
    assert req.partitions == {A: st(3)}


def test_reset_after_error_starts_over() -> None:
    s = FetchSession()
    s.on_response(s.build({A: st(0)}), session_id=9)
    s.on_response(s.build({A: st(4)}), session_id=9)
    s.reset()
    req = s.build({A: st(8)})
    assert req.full
    assert req.session_id == 0
    assert req.partitions == {A: st(8)}


def test_sessionless_mode() -> None:
    s = FetchSession(use_sessions=False)
    req = s.build({A: st(1)})
    assert req.session_epoch == -1
    assert req.partitions == {A: st(1)}
    s.on_response(req, session_id=5)
    assert s.build({A: st(1)}).session_epoch == -1


def test_epoch_wraps_to_one() -> None:
    s = FetchSession()
    s.on_response(s.build({A: st(0)}), session_id=3)
    s.next_epoch = 2**31 - 1
    req = s.build({A: st(0)})
    s.on_response(req, session_id=3)
    assert s.next_epoch == 1
