"""Reconnect backoff: 100 ms doubling to 60 s, reset once a stream is subscribed again.

Pulsar's client ``Backoff`` (initial 100 ms, max 60 s), including its jitter: each
wait is up to 10 % shorter than the nominal delay, so consumers that lost the same
dispatcher do not all come back in the same millisecond. Pure: the caller does the
waiting.
"""

from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    def __init__(self, initial: float = 0.1, maximum: float = 60.0, jitter: bool = True) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError("need 0 < initial <= maximum")
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self._next = initial
        self.attempts = 0

    def next(self) -> float:
        """The wait before the next attempt; doubles the one after, up to the maximum."""
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        self.attempts += 1
        if self.jitter:
            return random.uniform(delay * 0.9, delay)
        return delay

    def peek(self) -> float:
        return self._next

    def reset(self) -> None:
        self._next = self.initial
        self.attempts = 0
