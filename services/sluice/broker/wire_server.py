"""The broker's wire-protocol connections: Produce and Fetch over plain TCP (``docs/wire.md``).

A transport adapter: frames -> core call (through ``handlers``) -> frames, and nothing else.
Validation, authorization, the parked reads and the follow are the core's
(``sluice.broker.service``); this module owns only what a frame's order and the connection's
back-pressure mean.

Why a second listener beside gRPC: under grpcio a message costs each side several thread
hand-offs (the transport's threads, the completion-queue poller, the event loop), about ten
context switches per record end to end, and on a small machine that, not Sluice's code, is
most of the CPU a record costs. Here a frame is read by the event loop itself, and a produce
under ``flush=interval`` is appended and answered inside that one callback.

Per connection (the hello, protocol errors and back-pressure are ``sluice.server.wire``'s):
- produce frames are appended in arrival order and answered in that order, each at once,
  or once its fsync is done under ``flush=always`` (one group commit answers them all);
- fetch frames are served one at a time, in order, by a task of the connection, and the
  next is served only once the previous answer could be written;
- a request's error travels in its answer;
- a ``continuous`` fetch is answered once as any fetch, then followed by the core
  (``BrokerService.follow``) from its answer's next offsets, round after round, until
  another fetch frame arrives or a partition answers with an error: a
  long-polling consumer then costs one frame per answer instead of two, and the broker no
  task switch per answer.
"""

from __future__ import annotations

import asyncio
import collections

from sluice.broker.follow import ContinuousFetch
from sluice.broker.handlers import AppendedProduce, RequestHandlers
from sluice.common.wire import FrameType, WireProtocolError
from sluice.server.context import ANONYMOUS, WIRE, RequestContext
from sluice.server.interceptors import Authenticator
from sluice.server.wire import WireConnection, WireListener, parse_frame
from sluice.v1 import broker_pb2

__all__ = ["broker_wire_listener"]


def broker_wire_listener(
    handlers: RequestHandlers, host: str, port: int, authenticator: Authenticator | None = None
) -> WireListener:
    return WireListener(
        "broker", lambda listener: _BrokerConnection(listener, handlers), host, port, authenticator
    )


class _BrokerConnection(WireConnection):
    def __init__(self, listener: WireListener, handlers: RequestHandlers) -> None:
        super().__init__(listener)
        self._handlers = handlers
        #: Produce answers owed, in request order; the head may wait for its fsync.
        self._produces: collections.deque[AppendedProduce] = collections.deque()
        self._produce_task: asyncio.Task[None] | None = None
        self._fetches: collections.deque[broker_pb2.FetchRequest] = collections.deque()
        self._fetch_task: asyncio.Task[None] | None = None
        self._follow: ContinuousFetch | None = None
        self._ctx = RequestContext(ANONYMOUS, WIRE)

    def opened(self) -> None:
        """The hello was accepted. The authentication seam (``docs/architecture.md``): the
        security issue sets the principal its authenticator returned for the hello here."""
        self._ctx = RequestContext(ANONYMOUS, WIRE)

    def backlog(self) -> int:
        return len(self._produces) + len(self._fetches)

    def lost(self) -> None:
        self._stop_following()
        for task in (self._produce_task, self._fetch_task):
            if task is not None:
                task.cancel()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._follow is not None:
            self._follow.resume()

    def _stop_following(self) -> None:
        if self._follow is not None:
            self._follow.stop()
            self._follow = None

    def on_frame(self, kind: int, payload: bytes) -> None:
        if kind == FrameType.PRODUCE:
            self._produce(parse_frame(broker_pb2.ProduceRequest, payload, "produce"))
        elif kind == FrameType.FETCH:
            self._stop_following()  # a new fetch replaces a continuous one
            self._fetches.append(parse_frame(broker_pb2.FetchRequest, payload, "fetch"))
            if self._fetch_task is None:
                self._fetch_task = asyncio.get_running_loop().create_task(self._serve_fetches())
        else:
            raise WireProtocolError(f"unknown frame type {kind}")

    def _produce(self, request: broker_pb2.ProduceRequest) -> None:
        item = self._handlers.append(request, self._ctx)
        if not item.durable and not self._produces:
            # flush=interval/never, or an error: the answer goes out inside this callback.
            self.write(FrameType.PRODUCE, self._handlers.produce_answer(item).SerializeToString())
            return
        self._produces.append(item)
        if self._produce_task is None:
            self._produce_task = asyncio.get_running_loop().create_task(self._answer_produces())

    async def _answer_produces(self) -> None:
        """Answer owed produces in order, each once its fsync is done."""
        handlers = self._handlers
        produces = self._produces
        try:
            while produces:
                await handlers.wait_durable(produces[0])
                answer = handlers.produce_answer(produces.popleft())
                self.write(FrameType.PRODUCE, answer.SerializeToString())
                self.update_reading()
        finally:
            self._produce_task = None

    async def _serve_fetches(self) -> None:
        handlers = self._handlers
        fetches = self._fetches
        try:
            while fetches:
                await self.writable.wait()
                request = fetches.popleft()
                answer, follow = await handlers.fetch(request, self._ctx)
                self.write(FrameType.FETCH, answer.SerializeToString())
                self.update_reading()
                if follow is not None and not fetches and not self.closing:
                    # Go on from where this answer ended (the core decided it can be followed).
                    self._follow = handlers.follow(
                        follow, request.request_id, self._ctx, self._send_fetch, lambda: self.takes_writes
                    )
        finally:
            self._fetch_task = None

    def _send_fetch(self, payload: bytes) -> None:
        self.write(FrameType.FETCH, payload)
