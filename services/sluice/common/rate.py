"""The one token bucket behind every rate limit in Sluice.

Four limits share it: the broker's client quotas (KIP-219 throttle time), the controller's partition
mutation quota (KIP-599), the reassignment's replication throttle and the failed-login limiter. They
differ only in units and in what they do when the bucket is short, so that is all each of them says:

- ``rate`` tokens a second refill the bucket up to ``capacity`` (the burst);
- ``spend`` takes tokens and may go into debt, down to ``floor``: a request that starts with tokens
  left is admitted whole (Kafka's rule), and the debt is paid back before the next one, so over time
  the rate holds whatever the request sizes;
- ``wait_s`` says how long until the bucket holds what the caller needs.

Time is the caller's monotonic clock, in seconds, passed in: every user is single-threaded or holds
its own lock, and tests drive the clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["BucketMap", "TokenBucket"]

K = TypeVar("K", bound=Hashable)


class TokenBucket:
    """``rate`` tokens a second, at most ``capacity`` held; starts full."""

    __slots__ = ("_at", "_tokens", "capacity", "rate")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        if rate <= 0 or capacity < 0:
            raise ValueError(f"a token bucket needs a positive rate and a capacity >= 0 ({rate}, {capacity})")
        self.rate = float(rate)
        self.capacity = float(capacity)
        self._tokens = self.capacity
        self._at = now

    def tokens(self, now: float) -> float:
        """What the bucket holds at ``now`` (negative: in debt)."""
        if now > self._at:
            self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
            self._at = now
        return self._tokens

    def spend(self, amount: float, now: float, floor: float = -math.inf) -> float:
        """Take ``amount`` (the debt never goes below ``floor``); returns what is left."""
        self._tokens = max(floor, self.tokens(now) - amount)
        return self._tokens

    def give_back(self, amount: float, now: float) -> None:
        """Return tokens taken for something that turned out to cost nothing."""
        self._tokens = min(self.capacity, self.tokens(now) + amount)

    def wait_s(self, now: float, need: float = 1.0) -> float:
        """Seconds until the bucket holds ``need`` tokens (0: it does now)."""
        return max(0.0, (need - self.tokens(now)) / self.rate)

    def retune(self, rate: float, capacity: float, now: float) -> None:
        """A new rate from now on (a quota changed); what is held is kept, within the new capacity."""
        held = self.tokens(now)
        self.rate = float(rate)
        self.capacity = float(capacity)
        self._tokens = min(self.capacity, held)

    def is_full(self, now: float) -> bool:
        """A full bucket is the same as none: its owner may forget it."""
        return self.tokens(now) >= self.capacity


class BucketMap(Generic[K]):
    """One bucket per key (a principal, an address), at most ``max_keys``, least recently used first out.

    A forgotten key starts again full, so bounding the map only ever forgives a caller's debt early; the
    memory stays bounded whatever the callers do.
    """

    def __init__(self, rate: float, capacity: float, max_keys: int) -> None:
        self.rate = rate
        self.capacity = capacity
        self.max_keys = max_keys
        self._buckets: OrderedDict[K, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def find(self, key: K) -> TokenBucket | None:
        """The key's bucket if it has one (a key without one holds a full bucket); does not create one."""
        return self._buckets.get(key)

    def get(self, key: K, now: float) -> TokenBucket:
        """The key's bucket, made full if it has none, and marked most recently used."""
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = TokenBucket(self.rate, self.capacity, now)
        self._buckets[key] = bucket
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return bucket
