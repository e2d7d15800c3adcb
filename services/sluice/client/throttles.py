"""The SDK's side of KIP-219: after an answer with ``throttle_time_ms``, send nothing more to that
broker until the time is over (the broker would hold it anyway; waiting here keeps it out of the
broker's memory and keeps the connection free for other callers' answers). Not thread-safe: its
owner's lock guards it."""

from __future__ import annotations

import time
from typing import Protocol

from sluice.v1 import broker_pb2

__all__ = ["ThrottleWindows", "throttled_answer"]


class ThrottleWindows:
    """Per broker address: until when its last throttled answer asked us to wait."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def throttled(self, address: str, throttle_ms: int, now: float) -> None:
        if throttle_ms > 0:
            self._until[address] = max(self._until.get(address, now), now + throttle_ms / 1000)

    def blocked(self, address: str, now: float) -> bool:
        until = self._until.get(address)
        if until is None:
            return False
        if until <= now:
            del self._until[address]
            return False
        return True

    def next_end(self, now: float) -> float | None:
        """When the earliest wait ends (None: no broker is waited for); forgets the ended ones."""
        for address in [a for a, until in self._until.items() if until <= now]:
            del self._until[address]
        return min(self._until.values(), default=None)


class _BacksOff(Protocol):
    backoff_until: float


def throttled_answer(broker: _BacksOff, answer: broker_pb2.FetchResponse) -> broker_pb2.FetchResponse:
    """The fetcher's side: a fetch answer with ``throttle_time_ms`` puts the broker's next request
    off by that long (``backoff_until``, which the fetcher already honours). A followed fetch needs
    nothing: the broker paces its rounds itself."""
    if answer.throttle_time_ms > 0:
        broker.backoff_until = max(broker.backoff_until, time.monotonic() + answer.throttle_time_ms / 1000)
    return answer
