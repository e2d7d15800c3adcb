"""A continuous fetch (``FetchRequest.continuous``, wire protocol only) after its first answer.

Served as an ordinary fetch, each round would cost a task wake-up, a parked-fetch setup (an
``asyncio.Event``, a timeout, the watch registration), re-validating the request and a session
lookup, all to learn what the previous answer already said: where to read next. At a steady
rate of one record per answer that overhead was most of what the broker spent serving a
feed. A :class:`ContinuousFetch` instead stays registered with the append waiters across
rounds and does its work in callbacks:

- a round reads from where the last answer ended (``begin_read``); if that is ready (records
  waiting, or nothing to wait for) it answers, else it parks;
- an append's listener calls :meth:`wake` synchronously, which reads the new bytes and answers
  when ready, inside the producer's own callback: the record reaches the follower before the
  producer hears back;
- ``max_wait_ms`` is one timer per follower, re-armed only when it fires early, never per round;
- back-pressure: a round starts only while the connection takes writes; :meth:`resume` starts
  the next one when it does again;
- the next round after an immediate answer (a backlog) is started with ``call_soon``, so
  draining a long backlog shares the event loop with other connections.

It ends when its connection sends another fetch or goes away (:meth:`stop`), when an answer
carries an error (the client decides what next), or when the broker stops.
Every round is counted as one Fetch in the RPC metrics, as each answer of a served fetch is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

from sluice.broker.fetch import FetchLimits, FetchRead, PartitionSpec, TopicPartitionKey
from sluice.broker.handlers import fetch_response_to_proto
from sluice.broker.service import BrokerService, FetchOutcome
from sluice.errors import SluiceError
from sluice.server.metrics import MethodRecorder
from sluice.v1 import broker_pb2

__all__ = ["ContinuousFetch"]


class ContinuousFetch:
    """Rounds of one continuous fetch on one connection. Event-loop thread only."""

    def __init__(
        self,
        service: BrokerService,
        specs: list[PartitionSpec],
        limits: FetchLimits,
        request_id: int,
        send: Callable[[broker_pb2.FetchResponse], None],
        writable: Callable[[], bool],
        metrics: MethodRecorder,
    ) -> None:
        self._service = service
        self._specs = specs
        self._limits = limits
        self._request_id = request_id
        self._send = send
        self._writable = writable
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        #: The partitions watched (the append waiters' registration, kept across rounds).
        self.keys: tuple[TopicPartitionKey, ...] = ()
        #: The parked round, or None between rounds.
        self._read: FetchRead | None = None
        self._started = 0.0
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._round_scheduled = False
        self._stopped = False

    def start(self) -> None:
        self._next_round()

    def stop(self) -> None:
        """End it (another fetch came, or the connection is gone); nothing more is sent."""
        if self._stopped:
            return
        self._stopped = True
        if self._read is not None:
            self._read = None
            self._service.metrics.fetch_parked.dec()
        self._service.waiters.unwatch(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

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
        try:
            read = self._service.begin_read(self._specs, self._limits)
        except SluiceError as err:  # the broker is stopping
            self._answer_error(err)
            return
        if read.ready():
            self._answer(read)
            return
        self._read = read
        self._service.metrics.fetch_parked.inc()
        self._watch(read)
        self._deadline = self._loop.time() + self._limits.max_wait_ms / 1000
        if self._timer is None:
            self._timer = self._loop.call_at(self._deadline, self._on_timer)

    def _watch(self, read: FetchRead) -> None:
        keys = tuple(read.waiting_keys())
        if keys != self.keys:
            self._service.waiters.watch(self, keys)

    def wake(self, key: TopicPartitionKey | None) -> None:
        read = self._read
        if read is None:
            return  # between rounds: the next round reads from the log anyway
        if key is not None:
            self._service.read_again(read, (key,))
            if not read.ready():
                self._watch(read)
                return
        self._answer(read)

    def _on_timer(self) -> None:
        self._timer = None
        if self._read is None or self._stopped:
            return  # the next parked round arms it again
        if self._loop.time() >= self._deadline:
            self._answer(self._read)
        else:
            self._timer = self._loop.call_at(self._deadline, self._on_timer)

    def _answer(self, read: FetchRead) -> None:
        if self._read is not None:
            self._read = None
            self._service.metrics.fetch_parked.dec()
        parts = self._service.finish_read(read)
        self._metrics.record("OK", self._started)
        self._send(fetch_response_to_proto(FetchOutcome(0, parts), self._request_id))
        if any(part.error is not None for part in parts):
            self.stop()
            return
        self._specs = [
            dataclasses.replace(spec, fetch_offset=part.position)
            for spec, part in zip(self._specs, parts, strict=True)
        ]
        if not self._round_scheduled:
            self._round_scheduled = True
            self._loop.call_soon(self._next_round)

    def _answer_error(self, err: SluiceError) -> None:
        self._metrics.record(err.code_name, self._started)
        self._send(broker_pb2.FetchResponse(error=err.to_proto(), request_id=self._request_id))
        self.stop()
