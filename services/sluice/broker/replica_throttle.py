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

from sluice.common.rate import TokenBucket

__all__ = ["Throttle"]


class Throttle(TokenBucket):
    """The token bucket of ``common/rate.py`` in bytes: ``rate`` bytes/s, one second's worth of burst."""

    __slots__ = ()

    def __init__(self, rate: int, now: float) -> None:
        super().__init__(rate, rate, now)

    def allowance(self, now: float) -> int:
        """The bytes the next fetch may ask for (0: none now)."""
        return max(0, int(self.tokens(now)))
