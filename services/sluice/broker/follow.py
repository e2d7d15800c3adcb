"""A continuous fetch (``FetchParams.continuous``, wire protocol only) after its first answer.

Part of the broker core, started by ``BrokerService.follow``. Served as an ordinary fetch,
each round would cost a task wake-up, a parked-fetch setup, re-validating the request and a
session lookup, all to learn what the previous answer already said: where to read next. At a
steady rate of one record per answer that overhead was most of what the broker spent serving a
feed. A :class:`ContinuousFetch` instead keeps one :class:`~sluice.broker.longpoll.ParkedRead`
across rounds and does its work in callbacks:

- a round reads from where the last answer ended (``begin_read``); if that is ready (records
  waiting, or nothing to wait for) it answers, else it parks;
- an append wakes the parked read synchronously, which reads the new bytes and, when ready,
  answers inside the producer's own callback: the record reaches the follower before the
  producer hears back;
- ``max_wait_ms`` is the parked read's one timer, never one per round;
- back-pressure: a round starts only while the transport takes writes; :meth:`resume` starts
  the next one when it does again;
- the next round after an immediate answer (a backlog) is started with ``call_soon``, so
  draining a long backlog shares the event loop with other connections;
- it keeps a private fetch session (``sessions.FetchSession``) that advances itself, and a
  standing watch registered once for all its partitions: a round reads only the partitions
  appended to or not yet caught up, and answers only the partitions with something new
  (``FetchOutcome.delta``; the adapter sends the others again as they were). So an idle round
  costs one timer and no work per partition (``docs/fetch.md``, "Idle long-polls").

It ends when its connection sends another fetch or goes away (:meth:`stop`), when an answer
carries an error (the client decides what next), or when the broker stops. Answers go to the
transport's ``deliver(outcome, started)`` as domain objects; the adapter encodes and counts them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from sluice.broker.fetch import FetchLimits, FetchRead, PartitionRead, PartitionSpec, TopicPartitionKey
from sluice.broker.longpoll import ParkedRead, StandingWatch
from sluice.broker.requests import FetchOutcome, FollowFrom
from sluice.broker.sessions import FetchSession
from sluice.broker.stages import FOLLOW_ANSWER
from sluice.errors import SluiceError
from sluice.security.context import RequestContext

__all__ = ["ContinuousFetch", "Deliver", "FetchCore"]

#: Where a follow's answers go: the outcome and when its round started (``time.perf_counter``).
Deliver = Callable[[FetchOutcome, float], None]


class FetchCore(Protocol):
    """The part of the core a follow's rounds use (``BrokerService``)."""

    def begin_read(
        self, specs: Iterable[PartitionSpec], limits: FetchLimits, ctx: RequestContext, others: int = 0
    ) -> FetchRead: ...
    def finish_read(self, read: FetchRead) -> list[PartitionRead]: ...
    def parked_read(
        self,
        on_ready: Callable[[], None],
        standing: tuple[StandingWatch, FetchSession, RequestContext] | None = None,
    ) -> ParkedRead: ...
    def standing_watch(
        self,
        dirty: set[TopicPartitionKey],
        keys: Iterable[TopicPartitionKey],
        ctx: RequestContext | None = None,
    ) -> StandingWatch: ...


class ContinuousFetch:
    """Rounds of one continuous fetch on one connection. Event-loop thread only."""

    def __init__(
        self,
        core: FetchCore,
        plan: FollowFrom,
        ctx: RequestContext,
        deliver: Deliver,
        writable: Callable[[], bool],
    ) -> None:
        self._core = core
        #: Where each partition goes on from, what the follower was told, which to read next.
        self._session = FetchSession.of(0, plan.specs)
        self._limits = plan.limits
        self._ctx = ctx
        self._deliver = deliver
        self._writable = writable
        self._loop = asyncio.get_running_loop()
        self._watch = core.standing_watch(self._session.dirty, self._session.partitions, ctx)
        self._parked = core.parked_read(self._on_ready, (self._watch, self._session, ctx))
        #: The first round answers every partition; later ones only those with something new.
        self._answered = False
        #: The parked round, or None between rounds.
        self._read: FetchRead | None = None
        self._started = 0.0
        self._round_scheduled = False
        self._stopped = False

    def start(self) -> None:
        self._next_round()

    def stop(self) -> None:
        """End it (another fetch came, or the connection is gone); nothing more is sent."""
        if self._stopped:
            return
        self._stopped = True
        self._read = None
        self._parked.close()
        self._watch.close()

    def resume(self) -> None:
        """The connection takes writes again: go on if a round was held back for it."""
        if not self._stopped and self._read is None and not self._round_scheduled:
            self._next_round()

    # ---- rounds -------------------------------------------------------------------------

    def _next_round(self) -> None:
        self._round_scheduled = False
        if self._stopped or not self._writable():
            return  # resume() goes on when the connection drains
        self._started = time.perf_counter()
        session = self._session
        specs = session.dirty_specs()
        try:
            read = self._core.begin_read(specs, self._limits, self._ctx, len(session.partitions) - len(specs))
        except SluiceError as err:  # the broker is stopping
            self._deliver(FetchOutcome(0, [], err), self._started)
            self.stop()
            return
        if read.ready():
            self._answer(read)
            return
        self._read = read
        self._parked.park(read, self._limits.max_wait_ms)

    def _on_ready(self) -> None:
        read = self._read
        if read is None:
            return
        self._read = None
        self._parked.take()
        self._answer(read)

    def _answer(self, read: FetchRead) -> None:
        ready = time.perf_counter()
        parts = self._core.finish_read(read)
        delta = self._answered
        news = self._session.select(parts, incremental=delta)
        self._session.advance(parts)
        self._answered = True
        self._deliver(FetchOutcome(0, news, delta=delta), self._started)
        FOLLOW_ANSWER.observe(time.perf_counter() - ready)
        if any(part.error is not None for part in news):
            self.stop()
            return
        if not self._round_scheduled:
            self._round_scheduled = True
            self._loop.call_soon(self._next_round)
