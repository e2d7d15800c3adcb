"""Send futures: one shared result per batch, a tiny handle per record.

Like Kafka's ``ProduceRequestResult`` / ``FutureRecordMetadata``: every record of a
batch refers to the batch's :class:`BatchResult` plus its index in the batch, so
``send()`` allocates one small object and no lock, event or
``concurrent.futures.Future`` per record. The record's offset is
``base_offset + index`` once the broker has answered.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.errors import RequestTimedOut, SluiceError

__all__ = ["BatchResult", "FutureRecordMetadata", "FutureRecordsMetadata", "RecordMetadata"]

log = logging.getLogger("sluice.producer")

# Callbacks are rare; one lock for all of them keeps BatchResult small.
_CALLBACKS_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an acknowledged record was written. ``offset`` is -1 under ``acks=0`` when the
    broker did not report it."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class BatchResult:
    """The outcome of one batch, shared by the futures of all its records.

    Caller: the sender completes it exactly once (``complete``); futures read it.
    """

    __slots__ = (
        "_callbacks",
        "_done",
        "_event",
        "base_offset",
        "error",
        "log_append_time",
        "partition",
        "topic",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.base_offset = -1
        self.log_append_time = -1
        self.error: SluiceError | None = None
        self._done = False
        # Made by the first wait() that has to block: most batches are never waited on (callbacks,
        # flush), and with linger=0 every record is a batch of its own.
        self._event: threading.Event | None = None
        self._callbacks: list[Callable[[], None]] | None = None

    @property
    def done(self) -> bool:
        return self._done

    def wait(self, timeout: float | None = None) -> bool:
        if self._done:
            return True
        with _CALLBACKS_LOCK:
            if self._done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def complete(self, base_offset: int, log_append_time: int, error: SluiceError | None) -> None:
        """Set the outcome and run the callbacks (in the calling thread: the sender's)."""
        with _CALLBACKS_LOCK:
            if self._done:
                return
            self.base_offset = base_offset
            self.log_append_time = log_append_time
            self.error = error
            self._done = True
            event = self._event
            callbacks, self._callbacks = self._callbacks, None
        if event is not None:
            event.set()
        for fn in callbacks or ():
            try:
                fn()
            except Exception:
                log.exception("a send callback raised")

    def add_callback(self, fn: Callable[[], None]) -> None:
        with _CALLBACKS_LOCK:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn()


class FutureRecordMetadata:
    """The future of one sent record: ``result()`` gives its :class:`RecordMetadata`.

    Mirrors ``concurrent.futures.Future`` (``result``, ``exception``, ``done``,
    ``add_done_callback``); a timeout raises :class:`~sluice.errors.RequestTimedOut`,
    which is also a ``TimeoutError``.
    """

    __slots__ = ("_index", "_result", "_timestamp")

    def __init__(self, result: BatchResult, index: int, timestamp: int) -> None:
        self._result = result
        self._index = index
        self._timestamp = timestamp

    def done(self) -> bool:
        return self._result.done

    def cancelled(self) -> bool:
        return False

    def result(self, timeout: float | None = None) -> RecordMetadata:
        r = self._result
        if not r.wait(timeout):
            raise RequestTimedOut(f"record not acknowledged within {timeout} s (it may still be delivered)")
        if r.error is not None:
            raise _fresh(r.error)
        offset = r.base_offset + self._index if r.base_offset >= 0 else -1
        return RecordMetadata(r.topic, r.partition, offset, self._timestamp)

    def exception(self, timeout: float | None = None) -> SluiceError | None:
        r = self._result
        if not r.wait(timeout):
            raise RequestTimedOut(f"record not acknowledged within {timeout} s (it may still be delivered)")
        return r.error

    @property
    def batch(self) -> BatchResult:
        """The outcome shared by every record of this record's batch (sluice.aio waits on it once per
        batch rather than once per record)."""
        return self._result

    def add_done_callback(self, fn: Callable[[FutureRecordMetadata], Any]) -> None:
        """Call ``fn(future)`` once the record is acknowledged or failed (at once if it is).

        Callbacks run in the producer's sender thread: keep them short.
        """
        self._result.add_callback(lambda: fn(self))

    def __repr__(self) -> str:
        r = self._result
        state = "pending" if not r.done else ("failed" if r.error else "done")
        return f"<FutureRecordMetadata {r.topic}[{r.partition}] index={self._index} {state}>"


class FutureRecordsMetadata:
    """The one future of a ``send_many()`` call: done once every record of the call is acknowledged or
    failed. ``result()`` gives their :class:`RecordMetadata` in the order they were passed, or raises
    the first failure (a call whose records went to several batches may fail in part: ``results()``
    tells each record's outcome).

    The call's records sit in a few batches (one per partition they went to, more when one filled);
    this holds a *segment* per batch: (its shared result, the first record's index in it, how many),
    and the records' positions in the call in segment order (None: the call's own order). Nothing
    is made per record until ``result()`` asks for it.
    """

    __slots__ = ("_callbacks", "_count", "_left", "_order", "_segments", "_timestamp")

    def __init__(
        self, segments: list[tuple[BatchResult, int, int]], order: list[int] | None, timestamp: int
    ) -> None:
        self._segments = segments
        self._order = order
        self._timestamp = timestamp
        self._count = sum(s[2] for s in segments)
        #: Segments without an outcome yet, counted down by the batches' callbacks (made on the first
        #: add_done_callback; most callers wait instead).
        self._left = -1
        self._callbacks: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return self._count

    def done(self) -> bool:
        return all(s[0].done for s in self._segments)

    def cancelled(self) -> bool:
        return False

    def _wait(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for result, _first, _n in self._segments:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if not result.wait(left):
                raise RequestTimedOut(
                    f"records not acknowledged within {timeout} s (they may still be delivered)"
                )

    def exception(self, timeout: float | None = None) -> SluiceError | None:
        """The first failure among the call's batches (None: every record is acknowledged)."""
        self._wait(timeout)
        return next((s[0].error for s in self._segments if s[0].error is not None), None)

    def result(self, timeout: float | None = None) -> list[RecordMetadata]:
        error = self.exception(timeout)
        if error is not None:
            raise _fresh(error)
        return [m for m in self.results(0) if isinstance(m, RecordMetadata)]

    def results(self, timeout: float | None = None) -> list[RecordMetadata | SluiceError]:
        """Each record's outcome, in the call's order: its metadata, or the error that failed it."""
        self._wait(timeout)
        ts = self._timestamp
        flat: list[RecordMetadata | SluiceError] = []
        for r, first, n in self._segments:
            if r.error is not None:
                flat += [r.error] * n
            elif r.base_offset < 0:
                flat += [RecordMetadata(r.topic, r.partition, -1, ts)] * n
            else:
                base = r.base_offset + first
                flat += [RecordMetadata(r.topic, r.partition, base + i, ts) for i in range(n)]
        if self._order is None or not flat:
            return flat
        out: list[RecordMetadata | SluiceError] = [flat[0]] * len(flat)
        for i, pos in enumerate(self._order):
            out[pos] = flat[i]
        return out

    def add_done_callback(self, fn: Callable[[FutureRecordsMetadata], Any]) -> None:
        """Call ``fn(future)`` once every record of the call has its outcome (at once if they have).
        One callback per batch of the call underneath, not per record. Runs in the sender thread."""
        with _CALLBACKS_LOCK:
            first = self._left < 0
            if first:
                self._left = len(self._segments)
            now = self._left == 0
            if not now:
                self._callbacks.append(lambda: fn(self))
        if now:
            fn(self)  # every segment is done (or the call had no record)
        elif first:
            for result, _first, _n in self._segments:
                result.add_callback(self._segment_done)

    def _segment_done(self) -> None:
        with _CALLBACKS_LOCK:
            self._left -= 1
            if self._left:
                return
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            try:
                cb()
            except Exception:
                log.exception("a send_many callback raised")

    def __repr__(self) -> str:
        return f"<FutureRecordsMetadata records={self._count} batches={len(self._segments)}>"


def _fresh(err: SluiceError) -> SluiceError:
    # Every record of a failed batch raises its own copy, so tracebacks do not pile up on one object.
    return copy.copy(err).with_traceback(None)
