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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.errors import RequestTimedOut, SluiceError

__all__ = ["BatchResult", "FutureRecordMetadata", "RecordMetadata"]

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


def _fresh(err: SluiceError) -> SluiceError:
    # Every record of a failed batch raises its own copy, so tracebacks do not pile up on one object.
    return copy.copy(err).with_traceback(None)
