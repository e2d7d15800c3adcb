"""The fetch quota on a followed (continuous) fetch's rounds (docs/wire.md, docs/quotas.md).

A followed fetch is answered round after round with no request in between, so each round is metered
as one fetch (its record bytes, one request) and carries its throttle time; while the caller is
throttled the next round is not read (the follow's ``writable`` says no) and a timer resumes it
when the hold has passed, exactly as a throttled caller's next fetch request would wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sluice.quotas.model import Resource
from sluice.quotas.throttle import FETCH, HELD, QuotaManager, throttle_ms
from sluice.security.context import RequestContext
from sluice.v1 import broker_pb2

__all__ = ["FollowThrottle"]

_THROTTLE_FIELD = broker_pb2.FetchResponse.DESCRIPTOR.fields_by_name["throttle_time_ms"].number


class FollowThrottle:
    """One follow's quota: wraps its ``writable`` and stamps its answers."""

    def __init__(self, quotas: QuotaManager, ctx: RequestContext, metered: bool) -> None:
        self._quotas = quotas
        self._ctx = ctx
        self._metered = metered
        #: The follow to resume once a hold passed (set once it exists).
        self.resume: Callable[[], None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def writable(self, inner: Callable[[], bool]) -> bool:
        if not self._metered or not self._quotas.enabled:
            return inner()
        hold = self._quotas.hold_s(self._ctx, FETCH)
        if hold > 0:
            if self._timer is None:
                HELD.inc()
                self._timer = asyncio.get_running_loop().call_later(hold, self._resume)
            return False
        return inner()

    def stamp(self, payload: bytes, record_bytes: int) -> bytes:
        """Meter one round; its answer with ``throttle_time_ms`` appended when throttled (protobuf
        reads concatenated fields as one message)."""
        if not self._metered or not self._quotas.enabled:
            return payload
        amounts = ((Resource.FETCH_BYTES, float(record_bytes)), (Resource.REQUESTS, 1.0))
        ms = throttle_ms(self._quotas.record(self._ctx, amounts))
        if not ms:
            return payload
        return payload + _varint(_THROTTLE_FIELD << 3) + _varint(ms)

    def _resume(self) -> None:
        self._timer = None
        if self.resume is not None:
            self.resume()


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
