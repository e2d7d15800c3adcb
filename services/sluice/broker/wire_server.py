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
  task switch per answer;
- version 2 (``docs/wire.md``, "Lanes"): fetches travel in lanes, each lane served as a
  version-1 connection serves its fetches (in order, one at a time, a new fetch replacing the
  followed one), lanes independently of each other; a lane's follow sends only while its
  client granted room (credit) for more answers, so a client that stops reading one lane
  stops that lane alone. A version-1 connection's fetch frames are lane 0, with no credit.
"""

from __future__ import annotations

import asyncio
import collections
import time

from sluice.broker import stages
from sluice.broker.follow import ContinuousFetch
from sluice.broker.handlers import AppendedProduce, RequestHandlers
from sluice.broker.memory import Reservation
from sluice.broker.requests import FetchParams
from sluice.common.wire import (
    LANE,
    LANE_CREDIT,
    LANES_VERSION,
    FrameType,
    Payload,
    WireProtocolError,
    has_records,
    lane_frame_parts,
    parse_frame,
)
from sluice.quotas.gate import ThrottleGate
from sluice.quotas.throttle import PRODUCE
from sluice.security.context import ANONYMOUS, WIRE, RequestContext
from sluice.security.service import ServiceSecurity
from sluice.security.tls import ServerTLS
from sluice.server.wire import MAX_BACKLOG, WireConnection, WireListener
from sluice.v1 import broker_pb2

__all__ = ["broker_wire_listener"]


def broker_wire_listener(
    handlers: RequestHandlers,
    host: str,
    port: int,
    security: ServiceSecurity | None = None,
    tls: ServerTLS | None = None,
) -> WireListener:
    return WireListener(
        "broker",
        lambda listener: _BrokerConnection(listener, handlers),
        host,
        port,
        security,
        version=LANES_VERSION,
        tls=tls,
    )


class _FetchLane:
    """The fetches of one lane: queued requests, the task serving them, the follow."""

    __slots__ = ("credit", "fetches", "follow", "prefix", "task")

    def __init__(self, prefix: bytes, credit: int | None) -> None:
        #: The lane header of its answers (b"" for lane 0, the version-1 fetch frames).
        self.prefix = prefix
        #: Answers the client has room for (None: no limit, version 1).
        self.credit = credit
        #: Each request, with its parameters when parsed as it was read (a follower's).
        self.fetches: collections.deque[tuple[broker_pb2.FetchRequest, FetchParams | None]] = (
            collections.deque()
        )
        self.task: asyncio.Task[None] | None = None
        self.follow: ContinuousFetch | None = None

    def stop_following(self) -> None:
        if self.follow is not None:
            self.follow.stop()
            self.follow = None


class _BrokerConnection(WireConnection):
    #: Large produce frames are read into their own buffers once the produce pool grants them.
    preallocates_frames = True

    def __init__(self, listener: WireListener, handlers: RequestHandlers) -> None:
        super().__init__(listener)
        self._handlers = handlers
        #: Produce answers owed, in request order; the head may wait for its fsync.
        self._produces: collections.deque[AppendedProduce] = collections.deque()
        self._produce_task: asyncio.Task[None] | None = None
        #: Lanes with a fetch queued, served or followed (0: version-1 fetch frames).
        self._lanes: dict[int, _FetchLane] = {}
        #: Fetch requests queued over all lanes (the backlog, without a walk over the lanes).
        self._queued_fetches = 0
        self._ctx = RequestContext(ANONYMOUS, WIRE)
        memory = handlers.service.memory
        self._produce_pool = memory.produce
        self._fetch_pool = memory.fetch
        #: The produce pool's bytes reserved for the frame now arriving (docs/memory.md), the
        #: wait for them when the pool could not grant them, and frames seen so far (a change
        #: says the reserved frame completed).
        self._frame_reserved = 0
        self._frame_wait: Reservation | None = None
        self._frames = 0
        #: Fetch answer bytes written while the transport was paused: they sit in its buffer
        #: and hold the fetch pool until it drains.
        self._fetch_unsent = 0
        #: Past the hello: only then does a frame reserve produce memory (before it, the
        #: pre-authentication limits apply, and a stranger must not hold the broker's budget).
        self._greeted_now = False
        #: A throttled caller's produce frames wait here, the connection muted (docs/quotas.md).
        self._gate = ThrottleGate(handlers.quotas, self.update_reading)

    def opened(self) -> None:
        """The hello was accepted: the context it built (the authenticated principal) is this
        connection's for every request."""
        self._ctx = self.ctx
        self._greeted_now = True

    def backlog(self) -> int:
        muted = MAX_BACKLOG if self._gate.muted else 0  # a throttled caller is not read from
        return len(self._produces) + self._queued_fetches + muted

    def busy(self) -> bool:
        """Not idle while an answer is owed, a lane is served or followed (a follow's answers come
        from the broker: its client may rightly send nothing for as long as it reads), or its reading
        is held by the memory budget or muted by a quota's throttle."""
        held = self._frame_wait is not None or self._gate.muted  # the broker, not the client, waits
        return bool(self._produces or self._lanes or self._queued_fetches or held)

    # ---- memory (docs/memory.md, "Broker") -----------------------------------------------

    def reading_held(self) -> bool:
        return self._frame_wait is not None

    def frame_buffer_allowed(self) -> bool:
        """Only a frame the produce pool has granted whole gets its buffer at once (docs/memory.md,
        "Produce, wire port"): what a peer's header makes the broker allocate is what it reserved."""
        reserved = self._frame_reserved
        return reserved > 0 and reserved == self.frame_in_progress

    def buffer_updated(self, nbytes: int) -> None:
        frames = self._frames
        super().buffer_updated(nbytes)
        if self._greeted_now and not self.closing:
            self._reserve_frame(frames != self._frames)

    def _reserve_frame(self, completed: bool) -> None:
        """Reserve the produce pool's bytes for the frame now arriving, all at once (Kafka's
        memory pool): granted frames always complete, so no set of half-read frames can
        deadlock the pool. Not granted: stop reading this socket until they are."""
        size = self.frame_in_progress
        if self._frame_reserved and (completed or size != self._frame_reserved):
            self._produce_pool.release(self._frame_reserved)  # the frame was read and handled
            self._frame_reserved = 0
        if size == 0 or self._frame_reserved or self._frame_wait is not None:
            return
        if self._produce_pool.try_take(size):
            self._frame_reserved = size
            return
        self._frame_wait = self._produce_pool.wait(size, lambda: self._frame_granted(size))
        self.update_reading()

    def _frame_granted(self, size: int) -> None:
        self._frame_wait = None
        self._frame_reserved = size
        self.update_reading()

    def _release_memory(self) -> None:
        if self._frame_wait is not None:
            self._produce_pool.cancel(self._frame_wait)
            self._frame_wait = None
        self._produce_pool.release(self._frame_reserved)
        self._frame_reserved = 0
        self._fetch_pool.release(self._fetch_unsent)
        self._fetch_unsent = 0
        self._fetch_pool.room_listeners.discard(self._resume_follows)

    def _resume_follows(self) -> None:
        self._fetch_pool.room_listeners.discard(self._resume_follows)
        for lane in list(self._lanes.values()):
            if lane.follow is not None:
                lane.follow.resume()

    def _can_follow(self, lane: _FetchLane) -> bool:
        if not self.takes_writes or (lane.credit is not None and lane.credit <= 0):
            return False
        if self._fetch_pool.has_room:
            return True
        self._fetch_pool.room_listeners.add(self._resume_follows)  # resumed when it has again
        return False

    def lost(self) -> None:
        self._release_memory()
        self._gate.close()
        if self._produce_task is not None:
            self._produce_task.cancel()
        for lane in self._lanes.values():
            lane.stop_following()
            if lane.task is not None:
                lane.task.cancel()
        self._lanes.clear()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._fetch_pool.release(self._fetch_unsent)  # the transport's buffer drained
        self._fetch_unsent = 0
        for lane in list(self._lanes.values()):
            if lane.follow is not None:
                lane.follow.resume()

    def on_frame(self, kind: int, payload: Payload) -> None:
        self._frames += 1
        if kind == FrameType.PRODUCE:
            request = parse_frame(broker_pb2.ProduceRequest, payload, "produce")
            if not self._gate.offer(self._ctx, PRODUCE, lambda: self._produce(request)):
                self._produce(request)
        elif kind == FrameType.FETCH:
            self._fetch(0, b"", None, parse_frame(broker_pb2.FetchRequest, payload, "fetch"))
        elif kind in (FrameType.FETCH_LANE, FrameType.LANE_CREDIT, FrameType.LANE_END):
            if self.version < LANES_VERSION:
                raise WireProtocolError(
                    f"frame type {kind} needs protocol version {LANES_VERSION}, "
                    f"the hello agreed {self.version}"
                )
            self._lane_frame(kind, payload)
        else:
            raise WireProtocolError(f"unknown frame type {kind}")

    # ---- lanes ----------------------------------------------------------------------------

    def _lane_frame(self, kind: int, payload: Payload) -> None:
        header = LANE_CREDIT if kind != FrameType.LANE_END else LANE
        if len(payload) < header.size:
            raise WireProtocolError(f"a frame of type {kind} shorter than its {header.size}-byte lane header")
        if LANE.unpack_from(payload)[0] == 0:
            raise WireProtocolError("lane 0 is the version-1 fetch frames': lanes are numbered from 1")
        if kind == FrameType.FETCH_LANE:
            lane_id, window = LANE_CREDIT.unpack_from(payload)
            request = parse_frame(broker_pb2.FetchRequest, payload[LANE_CREDIT.size :], "fetch")
            self._fetch(lane_id, bytes(payload[: LANE.size]), window, request)
            return
        lane_id = LANE.unpack_from(payload)[0]
        lane = self._lanes.get(lane_id)
        if kind == FrameType.LANE_END:
            if lane is not None:
                self._end_lane(lane_id, lane)
        elif lane is not None and lane.credit is not None:  # credit for a lane gone: nothing to do
            lane.credit += LANE_CREDIT.unpack_from(payload)[1]
            if lane.follow is not None:
                lane.follow.resume()

    def _end_lane(self, lane_id: int, lane: _FetchLane) -> None:
        del self._lanes[lane_id]
        lane.stop_following()
        self._queued_fetches -= len(lane.fetches)
        lane.fetches.clear()
        if lane.task is not None:
            lane.task.cancel()

    def _fetch(
        self, lane_id: int, prefix: bytes, window: int | None, request: broker_pb2.FetchRequest
    ) -> None:
        lane = self._lanes.get(lane_id)
        if lane is None:
            lane = self._lanes[lane_id] = _FetchLane(prefix, window)
        else:
            lane.stop_following()  # a new fetch replaces a continuous one
            lane.credit = window
        # A follower's positions count now, in this read callback (the HW, acks=all answers).
        lane.fetches.append((request, self._handlers.replica_params(request, self._ctx)))
        self._queued_fetches += 1
        if lane.task is None:
            lane.task = asyncio.get_running_loop().create_task(self._serve_fetches(lane_id, lane))

    def _answer_fetch(self, lane: _FetchLane, payload: bytes, has_records: bool) -> None:
        if lane.credit is not None and has_records:
            lane.credit -= 1  # an answer without records holds nothing in the client's memory
        if not lane.prefix:
            self.write(FrameType.FETCH, payload)
        else:
            transport = self.transport
            if transport is not None and not transport.is_closing():
                transport.writelines(lane_frame_parts(FrameType.FETCH_LANE, lane.prefix, payload))
        if not self.takes_writes and not self.closing:
            # Not sent yet: it holds the fetch pool until the transport drains (resume_writing).
            self._fetch_pool.force(len(payload))
            self._fetch_unsent += len(payload)

    def _produce(self, request: broker_pb2.ProduceRequest) -> None:
        started = time.perf_counter()
        item = self._handlers.append(request, self._ctx)
        if not item.durable and not self._produces:
            # flush=interval/never, or an error: the answer goes out inside this callback.
            self.write(FrameType.PRODUCE, self._handlers.produce_answer(item).SerializeToString())
            stages.PRODUCE.observe(time.perf_counter() - started)
            return
        stages.PRODUCE.observe(time.perf_counter() - started)
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
                item = produces.popleft()
                answer = handlers.produce_answer(item)
                self.write(FrameType.PRODUCE, answer.SerializeToString())
                stages.COMMIT.observe(time.perf_counter() - item.started)
                self.update_reading()
        finally:
            self._produce_task = None

    async def _serve_fetches(self, lane_id: int, lane: _FetchLane) -> None:
        handlers = self._handlers
        fetches = lane.fetches
        try:
            while fetches:
                await self.writable.wait()
                request, params = fetches.popleft()
                self._queued_fetches -= 1
                answer, follow, held = await handlers.fetch_held(request, self._ctx, params)
                try:
                    self._answer_fetch(lane, answer.SerializeToString(), has_records(answer))
                finally:
                    self._fetch_pool.release(held)  # written (what was not sent is counted apart)
                self.update_reading()
                if follow is not None and not fetches and not self.closing:
                    # Go on from where this answer ended (the core decided it can be followed),
                    # while the connection takes writes and the lane's client has room.
                    lane.follow = handlers.follow(
                        follow,
                        request.request_id,
                        self._ctx,
                        lambda payload, records: self._answer_fetch(lane, payload, records),
                        lambda: self._can_follow(lane),
                    )
        finally:
            lane.task = None
            if lane.follow is None and not fetches and self._lanes.get(lane_id) is lane:
                del self._lanes[lane_id]  # nothing left on it: a lane costs nothing between fetches
