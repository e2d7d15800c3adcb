"""Soft liveness of registered processes (brokers, dispatchers): pure, with time passed in.

Liveness is deliberately not persisted: it is a fact about the last few seconds, and a restarted coordinator
re-learns it from the next heartbeat. A session is bound to the epoch it was touched with, so a session
opened by a registration whose record then failed to persist (epoch not adopted) never counts as alive.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", int, str)


class Liveness(enum.Enum):
    #: Registered (in the persisted state) but not heard from since this coordinator started.
    UNKNOWN = "unknown"
    ALIVE = "alive"
    #: Silent for longer than the session timeout.
    EXPIRED = "expired"


_TRANSITIONS: dict[Liveness, frozenset[Liveness]] = {
    Liveness.UNKNOWN: frozenset({Liveness.ALIVE, Liveness.EXPIRED}),
    Liveness.ALIVE: frozenset({Liveness.ALIVE, Liveness.EXPIRED}),
    Liveness.EXPIRED: frozenset({Liveness.ALIVE}),
}


@dataclass
class Session:
    epoch: int
    last_seen_ms: int
    state: Liveness

    def move(self, to: Liveness) -> None:
        assert to in _TRANSITIONS[self.state], f"illegal liveness transition {self.state} -> {to}"
        self.state = to


class SessionTracker(Generic[K]):
    """Heartbeat deadlines per key.

    Caller: the cluster state machine's handlers (``touch``) and readers (``is_alive``); the service
    layer's timer (``expire``). Affects: soft state only.
    """

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self._sessions: dict[K, Session] = {}

    def touch(self, key: K, epoch: int, now_ms: int) -> bool:
        """Record a sign of life under ``epoch``. Returns True if the key was not alive before."""
        s = self._sessions.get(key)
        if s is None:
            self._sessions[key] = Session(epoch, now_ms, Liveness.ALIVE)
            return True
        was_alive = s.state is Liveness.ALIVE and s.epoch == epoch and not self._overdue(s, now_ms)
        s.move(Liveness.ALIVE)
        s.epoch = epoch
        s.last_seen_ms = max(s.last_seen_ms, now_ms)
        return not was_alive

    def watch(self, key: K, epoch: int, now_ms: int) -> None:
        """A registered key this coordinator has not heard from (recovered at its start): not alive, but
        expired by ``expire`` if still unheard one session timeout from now. Without it, a broker that
        died while no coordinator was up (or just before this one started) would never expire, and its
        partitions would keep a dead leader for ever. Kafka's controllers do the same: a new active
        controller starts every registered broker's session clock when it takes office."""
        if key not in self._sessions:
            self._sessions[key] = Session(epoch, now_ms, Liveness.UNKNOWN)

    def _overdue(self, s: Session, now_ms: int) -> bool:
        return now_ms - s.last_seen_ms > self.timeout_ms

    def state(self, key: K, epoch: int, now_ms: int) -> Liveness:
        s = self._sessions.get(key)
        if s is None or s.epoch != epoch:
            return Liveness.UNKNOWN
        if s.state is Liveness.ALIVE and self._overdue(s, now_ms):
            # Not yet swept by ``expire``; answer the truth anyway.
            return Liveness.EXPIRED
        return s.state

    def is_alive(self, key: K, epoch: int, now_ms: int) -> bool:
        return self.state(key, epoch, now_ms) is Liveness.ALIVE

    def last_seen_ms(self, key: K) -> int | None:
        s = self._sessions.get(key)
        return None if s is None else s.last_seen_ms

    def expire(self, now_ms: int) -> list[K]:
        """Move every overdue ALIVE (or watched and never heard) session to EXPIRED; return their keys (for
        logs, metrics and elections)."""
        expired = []
        for key, s in self._sessions.items():
            if s.state is not Liveness.EXPIRED and self._overdue(s, now_ms):
                s.move(Liveness.EXPIRED)
                expired.append(key)
        return expired
