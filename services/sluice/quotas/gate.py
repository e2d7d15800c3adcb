"""A wire connection muted while its caller is throttled (KIP-219's "mute the channel").

A frame of a throttled caller is not served: it is held, with every frame after it (their order is
kept), until the caller's hold time has passed; meanwhile the connection reports itself busy, so the
transport stops reading and TCP holds the client back. A client that ignores ``throttle_time_ms``
and keeps writing therefore gains nothing: its frames wait here, then in its own socket buffers.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from sluice.quotas.model import Resource
from sluice.quotas.throttle import HELD, QuotaManager
from sluice.security.context import RequestContext

__all__ = ["ThrottleGate"]


class ThrottleGate:
    """One connection's held frames. Use from the event loop."""

    def __init__(self, quotas: QuotaManager, ready: Callable[[], None]) -> None:
        self._quotas = quotas
        #: Called when held frames were released (the connection re-evaluates whether to read).
        self._ready = ready
        self._held: collections.deque[tuple[RequestContext, tuple[Resource, ...], Callable[[], None]]] = (
            collections.deque()
        )
        self._timer: asyncio.TimerHandle | None = None

    @property
    def muted(self) -> bool:
        """Frames are held: the connection must not read more."""
        return bool(self._held)

    def offer(self, ctx: RequestContext, resources: tuple[Resource, ...], run: Callable[[], None]) -> bool:
        """Hold ``run`` if the caller is throttled (or frames are held already); False: run it now."""
        if not self._held:
            wait = self._quotas.hold_s(ctx, resources)
            if wait <= 0:
                return False
            self._arm(wait)
        self._held.append((ctx, resources, run))
        HELD.inc()
        return True

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held.clear()

    def _arm(self, wait: float) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(wait, self._release)

    def _release(self) -> None:
        self._timer = None
        held = self._held
        while held:
            ctx, resources, run = held[0]
            wait = self._quotas.hold_s(ctx, resources)
            if wait > 0:  # what ran before throttled the caller again
                self._arm(wait)
                break
            held.popleft()
            run()
        self._ready()
