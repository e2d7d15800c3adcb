"""The replication throttle of a reassignment, on the follower's side (docs/replication.md, "Reassignment").

A follower outside the ISR of a partition whose assignment carries ``throttle_bytes_per_second`` (the
controller sets it on partitions being reassigned) fetches it through a token bucket: each fetch asks for
at most the bytes the bucket holds, the bytes received are spent, and a partition whose bucket is empty is
left out of the fetch until it refills (a timer wakes the fetcher; nothing polls). The leader may answer
one batch above the asked bytes (a batch is never split), so the bucket can go into debt, which the next
fetches pay back: over time the rate holds. Follower side, because the follower is the one that knows it
is catching up, and so a leader serving many moving partitions pays nothing per fetch for it.
"""

from __future__ import annotations

__all__ = ["Throttle"]


class Throttle:
    """A token bucket of ``rate`` bytes/s holding at most one second's worth (the burst)."""

    __slots__ = ("_at", "_tokens", "rate")

    def __init__(self, rate: int, now: float) -> None:
        self.rate = rate
        self._tokens = float(rate)
        self._at = now

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
            self._at = now

    def allowance(self, now: float) -> int:
        """The bytes the next fetch may ask for (0: none now)."""
        self._refill(now)
        return max(0, int(self._tokens))

    def spend(self, size: int, now: float) -> None:
        self._refill(now)
        self._tokens -= size

    def wait_s(self, now: float) -> float:
        """How long until the bucket holds a byte again."""
        self._refill(now)
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate
