"""The delivery batches in flight: a bounded window, settled in the order they were sent.

The delivery loop used to send one batch and wait for its acknowledgements before popping the next
(stop-and-wait). A broker that now and then takes 40-200 ms to answer one produce held up every record
due meanwhile (docs/delayed-delivery.md, "Re-run, session 14"). Now the loop keeps sending while an answer
is late, as Kafka's producer does with ``max.in.flight`` and idempotence: the scheduler's producers are
idempotent, so up to five batches per target partition fly at once and the broker's sequence check keeps
their order; the acknowledgement thread settles the batches strictly in send order (done marks, the
partitions' ends for the checkpoint), so the schedule's progress never passes a batch not yet
acknowledged. ``Window`` is that state, pure (no I/O, no clock: time is passed in).

When to send the next batch while one is in flight (``gate``): only once the first waiting record has
waited ``spacing_ms`` past both its due time and the last send. With answers in 0-2 ms (the usual case)
the loop behaves as before (the records due meanwhile go in the next batch, a few large requests rather
than many small ones, which cost the broker CPU per request); with a late answer it sends one batch per
``spacing_ms`` until the window is full. Bounds: ``max_batches`` batches and ``max_records`` records in
flight (the records are in memory already, popped from the timeline; the producer's ``buffer_memory``
bounds their bytes again).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from sluice.broker.schedule.delivery import Sent

__all__ = ["Flight", "Window"]


@dataclass
class Flight:
    """One delivery batch in flight."""

    sent: Sent
    #: When it was popped from the timeline, when its send took the batch lock and when the send
    #: returned (ms, for the trace).
    popped: int
    locked: int
    sent_at: int

    @property
    def size(self) -> int:
        return len(self.sent.batch)


class Window:
    """Caller: the delivery loop (``gate``, ``room``, ``push``) and the acknowledgement thread
    (``head``, ``pop``, ``take_all``), both under the scheduler's condition lock."""

    def __init__(self, max_batches: int, max_records: int, spacing_ms: int) -> None:
        assert max_batches >= 1
        assert max_records >= 1
        assert spacing_ms >= 0
        self.max_batches = max_batches
        self.max_records = max_records
        self.spacing_ms = spacing_ms
        self._flights: deque[Flight] = deque()
        self.records = 0
        #: Set when a batch failed (or could not be sent): nothing more is sent until recovery ends.
        self.broken = False
        self._last_sent = 0
        #: The most batches that were in flight at once (for the trace and the tests).
        self.peak = 0

    def __len__(self) -> int:
        return len(self._flights)

    def room(self) -> int:
        """How many records the next batch may hold (0: the window is full)."""
        if self.broken or len(self._flights) >= self.max_batches:
            return 0
        return max(0, self.max_records - self.records)

    def gate(self, now_ms: int, first_due: int) -> int | None:
        """Whether to send now the records due from ``first_due`` on: 0 yes, > 0 in that many ms (unless
        an answer comes first), None not until a batch is settled (the window is full or broken)."""
        if not self.room():
            return None
        if not self._flights:
            return 0
        return max(0, max(first_due, self._last_sent) + self.spacing_ms - now_ms)

    def push(self, flight: Flight) -> None:
        self._flights.append(flight)
        self.records += flight.size
        self._last_sent = flight.sent_at
        self.peak = max(self.peak, len(self._flights))

    def head(self) -> Flight | None:
        """The oldest batch in flight: the only one that may be settled next."""
        return self._flights[0] if self._flights else None

    def pop(self) -> Flight:
        """The head, settled."""
        flight = self._flights.popleft()
        self.records -= flight.size
        return flight

    def take_all(self) -> list[Flight]:
        """Every batch in flight, oldest first (a failure: they all go to recovery)."""
        out = list(self._flights)
        self._flights.clear()
        self.records = 0
        return out
