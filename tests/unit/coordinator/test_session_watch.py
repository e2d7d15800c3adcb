"""A coordinator that takes office watches every registered broker: one it never hears from expires after
a session timeout (docs/replication.md, "Chaos: leader kills"), one that heartbeats is alive as before."""

from __future__ import annotations

from sluice.coordinator.cluster.sessions import Liveness, SessionTracker


def test_a_watched_key_never_heard_from_expires_after_the_session_timeout() -> None:
    sessions = SessionTracker[int](3_000)
    sessions.watch(1, epoch=7, now_ms=10_000)
    assert sessions.state(1, 7, 10_000) is Liveness.UNKNOWN
    assert not sessions.is_alive(1, 7, 12_000)
    assert sessions.expire(13_000) == []  # within the timeout: not yet
    assert sessions.expire(13_001) == [1]
    assert sessions.state(1, 7, 13_001) is Liveness.EXPIRED
    assert sessions.expire(20_000) == []  # expired once
    # It comes back: alive, and the caller sees a revival (touch answers "was not alive").
    assert sessions.touch(1, 7, 21_000)
    assert sessions.is_alive(1, 7, 21_000)


def test_a_watched_key_that_heartbeats_stays_alive_and_watch_keeps_a_known_session() -> None:
    sessions = SessionTracker[int](3_000)
    sessions.watch(1, epoch=7, now_ms=10_000)
    assert sessions.touch(1, 7, 11_000)
    assert sessions.expire(13_500) == []
    sessions.watch(1, epoch=7, now_ms=13_500)  # a re-election in the same process: nothing changes
    assert sessions.is_alive(1, 7, 13_500)
    assert sessions.expire(14_001) == [1]  # 3 s after its last heartbeat, as before
