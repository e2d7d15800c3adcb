"""Failed-attempt limiter: after a burst of failed logins, further attempts are refused at once.

A token bucket per client address and one per user name (docs/security.md, "Rate limiting"). Each failure
takes a token; the bucket refills at ``failures / window`` tokens a second. An attempt whose address or
user has an empty bucket is refused with :class:`~sluice.errors.Throttled` before any credential work, so
wrong passwords at full rate cost a dictionary lookup each, not a SCRAM exchange and a Redis read.

Memory is bounded: each side keeps at most ``max_entries`` buckets, least recently used first out. A bucket
that has refilled is the same as none, so forgetting one only ever forgets an attacker's debt early.

Caller: the coordinator's ``Authenticate`` (SCRAM); the authentication chain reuses it for bad JWTs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sluice.common.rate import BucketMap
from sluice.errors import InvalidArgument, Throttled

__all__ = ["FailureLimiter", "LimiterSettings", "client_host"]


@dataclass(frozen=True)
class LimiterSettings:
    #: Failures from one address within ``window_s`` before its attempts are refused.
    per_address: int = 20
    #: Failures for one user name within ``window_s`` before attempts for it are refused.
    per_user: int = 10
    window_s: float = 60.0
    max_entries: int = 10_000

    def __post_init__(self) -> None:
        if self.per_address < 1 or self.per_user < 1 or self.window_s <= 0 or self.max_entries < 1:
            raise InvalidArgument("failed-login limits must be positive")


class _Buckets:
    """A :class:`BucketMap` of failures: a failure takes a token (never below none), a success gives it
    back, and a key without a bucket has never failed. The owner holds the lock."""

    def __init__(self, capacity: int, window_s: float, max_entries: int) -> None:
        self.map: BucketMap[str] = BucketMap(capacity / window_s, float(capacity), max_entries)

    def take(self, key: str, now: float) -> None:
        self.map.get(key, now).spend(1.0, now, floor=0.0)

    def give_back(self, key: str, now: float) -> None:
        bucket = self.map.find(key)
        if bucket is not None:
            bucket.give_back(1.0, now)

    def wait_s(self, key: str, now: float) -> float:
        """How long until ``key`` may try again (0: now)."""
        bucket = self.map.find(key)
        return 0.0 if bucket is None else bucket.wait_s(now)


class FailureLimiter:
    """Thread-safe (the lock is held for a few dictionary operations)."""

    def __init__(self, settings: LimiterSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._lock = threading.Lock()
        self._addresses = _Buckets(settings.per_address, settings.window_s, settings.max_entries)
        self._users = _Buckets(settings.per_user, settings.window_s, settings.max_entries)

    def check(self, address: str, user: str | None = None) -> None:
        """Raise Throttled if ``address`` (or ``user``) has used up its failures; call before any work.
        For a check that completes before the next one starts (a JWT's); an exchange that spans round
        trips uses :meth:`begin`.

        The message is the same whichever side is exhausted and whether the user exists, so it tells an
        attacker nothing about user names."""
        with self._lock:
            self._raise_if_exhausted(address, user, self._clock())

    def begin(self, address: str, user: str | None = None) -> None:
        """:meth:`check`, then count the attempt as failed until :meth:`succeeded` says otherwise.

        So attempts in flight count: without it, a client with many concurrent exchanges would get
        that many past the limit before the first failure is counted. An exchange abandoned half way
        stays counted as a failure."""
        now = self._clock()
        with self._lock:
            self._raise_if_exhausted(address, user, now)
            self._addresses.take(address, now)
            if user is not None:
                self._users.take(user, now)

    def succeeded(self, address: str, user: str | None = None) -> None:
        """Give back what :meth:`begin` took: a successful login costs nothing."""
        now = self._clock()
        with self._lock:
            self._addresses.give_back(address, now)
            if user is not None:
                self._users.give_back(user, now)

    def _raise_if_exhausted(self, address: str, user: str | None, now: float) -> None:
        wait = self._addresses.wait_s(address, now)
        if user is not None:
            wait = max(wait, self._users.wait_s(user, now))
        if wait > 0:
            raise Throttled(f"too many failed logins; retry in {max(wait, 0.1):.1f} s")

    def failed(self, address: str, user: str | None = None) -> None:
        """Count one failed attempt against ``address`` (and ``user``)."""
        now = self._clock()
        with self._lock:
            self._addresses.take(address, now)
            if user is not None:
                self._users.take(user, now)

    def tracked(self) -> tuple[int, int]:
        """(addresses, users) with a bucket in memory (for tests and metrics)."""
        with self._lock:
            return len(self._addresses.map), len(self._users.map)


def client_host(peer: str) -> str:
    """The host part of a gRPC peer string (``ipv4:10.0.0.5:51234``, ``ipv6:[::1]:51234``): the
    limiter keys an address by host, since a client picks a new port per connection."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1:].partition("]")[0]
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return peer  # unix sockets and the like: the whole string
