"""A long-lived request stream: many request/response pairs over one bidirectional call.

Broker.ProduceStream and Broker.FetchStream answer requests in order, each response
carrying its request's ``request_id``. A stream message costs both ends far less than a
unary call (no per-call setup, no per-call metadata; about half the broker's CPU under
grpc.aio), which is what latency under load depends on.

:class:`RequestStream` opens the call lazily, matches answers to requests, and fails
every request still waiting when the call ends (broker gone, stream cancelled) with a
typed error, so callers keep the error handling they had for unary calls. A request
waiting past its deadline cancels the call: a hung broker is noticed as a unary
timeout would notice it. The next ``send`` opens a new call.

Threads: ``send`` from any thread; one reader thread per open call delivers answers by
calling the request's callback; one watchdog thread per stream enforces deadlines.
Callbacks must be quick and must not call back into the stream.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import grpc

from sluice.common.rpc import error_from_rpc
from sluice.errors import BrokerNotAvailable, RequestTimedOut, SluiceError

__all__ = ["RequestStream"]

log = logging.getLogger("sluice.client.streams")


class _Tagged(Protocol):
    request_id: int


Req = TypeVar("Req", bound=_Tagged)
Resp = TypeVar("Resp", bound=_Tagged)

Callback = Callable[[Any], None]  # receives the response or a SluiceError

_CLOSE = object()  # ends the request iterator: the client half-closes the call


@dataclass(slots=True)
class _Waiting:
    request_id: int
    deadline: float
    on_done: Callback


class _Call:
    """One open bidirectional call and the requests it still owes answers to."""

    def __init__(self) -> None:
        self.requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.waiting: collections.deque[_Waiting] = collections.deque()
        self.rpc: Any = None  # the grpc call object: an iterator of responses, cancellable
        self.ended = False
        self.cancelled = False  # by the watchdog

    def iterate_requests(self) -> Iterator[Any]:
        while True:
            item = self.requests.get()
            if item is _CLOSE:
                return
            yield item


class RequestStream(Generic[Req, Resp]):
    """Requests to one broker method over one long-lived call; see the module docstring."""

    def __init__(self, open_call: grpc.StreamStreamMultiCallable[Req, Resp], name: str) -> None:
        self._open_call = open_call
        self._name = name
        self._lock = threading.Lock()
        self._deadline_changed = threading.Condition(self._lock)
        self._call: _Call | None = None
        self._next_id = 1
        self._closed = False
        self._watchdog: threading.Thread | None = None
        #: When the watchdog wakes next (monotonic), and how long it sleeps while nothing waits.
        self._wake_at = 0.0
        self._idle_span = 1.0

    def send(self, request: Req, timeout: float, on_done: Callback) -> None:
        """Send ``request``; ``on_done`` later gets its response or a SluiceError (never both)."""
        error: SluiceError | None = None
        with self._lock:
            if self._closed:
                error = BrokerNotAvailable(f"{self._name}: the stream is closed")
            else:
                call = self._call
                if call is None or call.ended:
                    call = self._open()
                request.request_id = self._next_id
                self._next_id += 1
                deadline = time.monotonic() + timeout
                call.waiting.append(_Waiting(request.request_id, deadline, on_done))
                call.requests.put(request)
                self._idle_span = timeout
                # The watchdog already wakes before this deadline (it does for a stream whose
                # requests share one timeout): no thread wake-up on the request path.
                if deadline < self._wake_at:
                    self._deadline_changed.notify()
        if error is not None:
            on_done(error)

    def close(self) -> None:
        """End the stream; requests still waiting fail with BrokerNotAvailable."""
        with self._lock:
            self._closed = True
            call, self._call = self._call, None
            self._deadline_changed.notify()
        if call is not None:
            call.requests.put(_CLOSE)
            if call.rpc is not None:
                call.rpc.cancel()
            self._end(call, BrokerNotAvailable(f"{self._name}: the stream was closed"))

    # ---- internals (lock held where noted) ------------------------------------------

    def _open(self) -> _Call:
        """Open a new call (lock held). The reader thread starts it, off the caller's path."""
        call = self._call = _Call()
        threading.Thread(target=self._read, args=(call,), name=f"sluice-{self._name}", daemon=True).start()
        if self._watchdog is None:
            self._watchdog = threading.Thread(
                target=self._watch, name=f"sluice-{self._name}-deadlines", daemon=True
            )
            self._watchdog.start()
        return call

    def _read(self, call: _Call) -> None:
        error: SluiceError
        try:
            responses = self._open_call(call.iterate_requests())
            call.rpc = responses
            if call.ended:  # closed while opening
                call.rpc.cancel()
            for response in responses:
                with self._lock:
                    if call.ended:
                        # close() ended the call while this answer was on its way: every request
                        # it owed was failed already, so the answer belongs to nobody.
                        break
                    head = call.waiting.popleft() if call.waiting else None
                if head is None or head.request_id != response.request_id:
                    raise _OutOfOrder(head, response.request_id)
                head.on_done(response)
            error = BrokerNotAvailable(f"{self._name}: the broker ended the stream")
        except grpc.RpcError as exc:
            error = error_from_rpc(exc)
            if call.cancelled:  # the watchdog ended it, not the broker
                error = RequestTimedOut(f"{self._name}: no answer within the request's timeout")
        except _OutOfOrder as exc:
            log.error("%s: %s; reopening the stream", self._name, exc)
            error = BrokerNotAvailable(f"{self._name}: {exc}")
            if exc.head is not None:
                exc.head.on_done(error)
            if call.rpc is not None:
                call.rpc.cancel()
        self._end(call, error)

    def _end(self, call: _Call, error: SluiceError) -> None:
        """The call is over: every request it owes an answer fails with ``error``."""
        with self._lock:
            call.ended = True
            if self._call is call:
                self._call = None
            waiting = list(call.waiting)
            call.waiting.clear()
        call.requests.put(_CLOSE)
        for w in waiting:
            w.on_done(error)

    def _watch(self) -> None:
        """Cancel the call whose oldest request is past its deadline (a hung broker)."""
        with self._lock:
            while not self._closed:
                call = self._call
                head = call.waiting[0] if call is not None and call.waiting else None
                now = time.monotonic()
                if head is None:
                    # Idle: wake after one request timeout anyway. A request sent meanwhile has a
                    # deadline past that wake-up when it uses the same timeout, so send() need not
                    # wake this thread; one with a shorter timeout does (see send()).
                    self._wake_at = now + self._idle_span
                elif head.deadline > now:
                    self._wake_at = head.deadline
                else:
                    assert call is not None
                    if call.rpc is not None and not call.cancelled:
                        log.warning(
                            "%s: request %d timed out; cancelling the stream", self._name, head.request_id
                        )
                        call.cancelled = True
                        call.rpc.cancel()  # the reader fails what is waiting, with RequestTimedOut
                    self._wake_at = now + 0.05  # the reader ends the call (or is still opening it)
                self._deadline_changed.wait(self._wake_at - now)


class _OutOfOrder(Exception):
    def __init__(self, head: _Waiting | None, got: int) -> None:
        expected = "none" if head is None else str(head.request_id)
        super().__init__(f"answer to request {got} arrived, expected {expected}")
        self.head = head
