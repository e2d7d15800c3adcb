"""A bounded cache of verified bearer tokens, each dropped when it stops being valid.

A bearer token is verified once (a signature check, maybe a JWKS fetch or a TokenReview call); every
later presentation of the same string is a dictionary lookup. Keyed by the whole token string: the
same string carries the same signature, so it verifies the same way until its ``valid_until``.

Bounded twice: by size (past ``max_entries`` the entry that expires soonest goes), and by time (an
entry is never returned at or after its ``valid_until``, and expired entries are swept on insert).
"""

from __future__ import annotations

import heapq
from typing import Generic, TypeVar

__all__ = ["DEFAULT_MAX_ENTRIES", "TokenCache"]

T = TypeVar("T")

#: Tokens are ~1 KiB (a Kubernetes ServiceAccount token) to a few KiB; 4096 of them a few MiB.
DEFAULT_MAX_ENTRIES = 4096


class TokenCache(Generic[T]):
    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be positive")
        self._max_entries = max_entries
        self._entries: dict[str, tuple[float, T]] = {}
        # (valid_until, token) per insert; an item whose entry was replaced or removed is skipped when
        # popped (it no longer matches the entry's valid_until).
        self._expiries: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token: str, now: float) -> T | None:
        """The value cached for ``token`` while ``now < valid_until``, else None."""
        entry = self._entries.get(token)
        if entry is None:
            return None
        if now >= entry[0]:
            del self._entries[token]
            return None
        return entry[1]

    def put(self, token: str, value: T, valid_until: float, now: float) -> None:
        if valid_until <= now:
            return
        self._sweep(now)
        while len(self._entries) >= self._max_entries and token not in self._entries:
            self._evict_soonest()
        self._entries[token] = (valid_until, value)
        heapq.heappush(self._expiries, (valid_until, token))

    def clear(self) -> None:
        self._entries.clear()
        self._expiries.clear()

    def _sweep(self, now: float) -> None:
        while self._expiries and self._expiries[0][0] <= now:
            self._drop(*heapq.heappop(self._expiries))

    def _evict_soonest(self) -> None:
        while self._expiries:
            valid_until, token = heapq.heappop(self._expiries)
            if self._drop(valid_until, token):
                return

    def _drop(self, valid_until: float, token: str) -> bool:
        entry = self._entries.get(token)
        if entry is None or entry[0] != valid_until:
            return False
        del self._entries[token]
        return True
