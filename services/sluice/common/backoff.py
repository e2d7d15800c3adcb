"""The one retry/reconnect backoff: jittered exponential, bounded. Pure: the caller does the waiting.

Every loop that waits before asking a peer again (a channel reconnecting, a broker or dispatcher
registering with the coordinator, a ListOffsets round after a routing error, a push consumer's stream)
takes its delays from :class:`Backoff`. The numbers of the peer layer are :data:`PEER_INITIAL_S` and
:data:`PEER_MAX_S` (docs/architecture.md, "Peer layer", says why); a caller with a documented reason of
its own (the push consumer's 60 s, Pulsar's) passes other bounds, never another formula.

The jitter makes each wait up to 10 % shorter than the nominal delay (Pulsar's client ``Backoff``), so
peers that lost the same server in the same instant do not all come back in the same millisecond.
"""

from __future__ import annotations

import random

__all__ = ["PEER_INITIAL_S", "PEER_MAX_S", "Backoff"]

#: The first wait after a failure: a restarted peer on the same address is usually back within it.
PEER_INITIAL_S = 0.1
#: The longest wait: a peer that comes back is used again within this, at <= 1 attempt per this many s.
PEER_MAX_S = 2.0

_JITTER = 0.1


class Backoff:
    """``initial`` doubling to ``maximum``; ``reset()`` after a success.

    Caller: one loop at a time (not thread-safe: every user keeps its own instance).
    """

    def __init__(
        self, initial: float = PEER_INITIAL_S, maximum: float = PEER_MAX_S, jitter: bool = True
    ) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError("need 0 < initial <= maximum")
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self._next = initial
        #: Waits handed out since the last reset.
        self.attempts = 0

    def next(self) -> float:
        """The wait before the next attempt; doubles the one after, up to the maximum."""
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        self.attempts += 1
        if self.jitter:
            return random.uniform(delay * (1 - _JITTER), delay)
        return delay

    def peek(self) -> float:
        """The nominal delay ``next()`` hands out next (before jitter)."""
        return self._next

    def reset(self) -> None:
        self._next = self.initial
        self.attempts = 0
