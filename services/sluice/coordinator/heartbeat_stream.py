"""One member's ``ConsumerGroupStream``: heartbeats answered in order, with ``heartbeat_now`` pushed in
between whenever a write concerns the member (docs/groups.md, "The heartbeat stream").

A stream carries no state of its own: every message is an ordinary heartbeat, handled exactly like the
unary ``Heartbeat`` (fast path, write lock, fencing), so closing the stream changes nothing about the
member (it keeps its session until it times out or leaves). The stream only adds the push: it registers
with the service as the member's watcher, and the service calls it after a write that means the member
must heartbeat to make progress (a new target, a partition it waits for came free, it was removed).

Every message is validated on its own: a malformed one is answered with the error in the response's
``error`` field, and the stream stays open.

Caller: the servicer (one per call).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from sluice.coordinator.convert import heartbeat_from_proto, heartbeat_to_proto
from sluice.coordinator.groups.model import HeartbeatRequest, HeartbeatResponse
from sluice.coordinator.service import CoordinatorService
from sluice.errors import InvalidRequest, SluiceError
from sluice.server.metrics import MethodRecorder
from sluice.v1 import coordinator_pb2 as pb

__all__ = ["HeartbeatStream"]

log = logging.getLogger(__name__)

#: Requests read ahead of the one being answered. A member sends one heartbeat at a time; the bound only
#: stops a misbehaving client from queueing without limit (HTTP/2 flow control then holds it back).
_INBOX = 8
_NUDGE = pb.GroupStreamResponse(heartbeat_now=pb.HeartbeatNow())


_recorders: list[MethodRecorder] = []


def _recorder() -> MethodRecorder:
    """The coordinator's ``Heartbeat`` series (resolved once per process)."""
    if not _recorders:
        _recorders.append(MethodRecorder("coordinator", "Heartbeat"))
    return _recorders[0]


class _Push:
    """Inbox marker: send ``heartbeat_now``."""


class _End:
    """Inbox marker: the client finished (or the service is closing): end the stream."""


_PUSH = _Push()
_END = _End()
Item = pb.GroupStreamRequest | _Push | _End


class HeartbeatStream:
    def __init__(self, service: CoordinatorService) -> None:
        self._service = service
        self._inbox: asyncio.Queue[Item] = asyncio.Queue()
        #: Why the client's messages stopped, when the transport refused one (PERMISSION_DENIED).
        self._refused: SluiceError | None = None
        self._room = asyncio.Semaphore(_INBOX)
        self._push_queued = False
        self._watching: tuple[str, str] | None = None
        # A member repeats the same heartbeat and gets the same answer while nothing changes: the last
        # conversion each way is kept, so a steady heartbeat converts nothing.
        self._last_in: pb.GroupHeartbeatRequest | None = None
        self._last_request: HeartbeatRequest | None = None
        self._last_response: HeartbeatResponse | None = None
        self._last_out: pb.GroupStreamResponse | None = None
        # Each message is counted and timed as a Heartbeat request, so heartbeat rates and latencies read
        # the same however members send them (docs/metrics.md); the stream itself is counted once.
        self._recorder = _recorder()
        self._unwatch: Callable[[], None] | None = None

    async def run(
        self, requests: AsyncIterator[pb.GroupStreamRequest]
    ) -> AsyncIterator[pb.GroupStreamResponse]:
        pump = asyncio.get_running_loop().create_task(self._pump(requests), name="group-stream-reader")
        closed = self._service.stream_opened(self._close)
        try:
            while True:
                item = await self._inbox.get()
                if isinstance(item, _End):
                    if self._refused is not None:
                        raise self._refused
                    return
                if isinstance(item, _Push):
                    self._push_queued = False
                    yield _NUDGE
                    continue
                self._room.release()
                yield await self._answer(item)
        finally:
            pump.cancel()
            closed()
            self._follow(None)

    async def _pump(self, requests: AsyncIterator[pb.GroupStreamRequest]) -> None:
        try:
            async for request in requests:
                # Waits while the inbox is full: reading stops, so the client's sends back up.
                await self._room.acquire()
                self._inbox.put_nowait(request)
        except asyncio.CancelledError:
            raise
        except SluiceError as err:
            # A message the transport refused (the interceptor authorizes each one's group): the
            # stream ends with that error, not as if the client had closed it.
            self._refused = err
        except Exception as exc:  # the call was cancelled or the connection broke
            log.debug("heartbeat stream closed by the client: %r", exc)
        self._close()

    def _close(self) -> None:
        self._inbox.put_nowait(_END)

    def _push(self) -> None:
        """The service's watcher callback: coalesced (one pending push is enough)."""
        if not self._push_queued:
            self._push_queued = True
            self._inbox.put_nowait(_PUSH)

    async def _answer(self, message: pb.GroupStreamRequest) -> pb.GroupStreamResponse:
        started = time.perf_counter()
        group = ""
        try:
            if not message.HasField("heartbeat"):
                raise InvalidRequest("a ConsumerGroupStream message must carry a heartbeat")
            if message.heartbeat == self._last_in and self._last_request is not None:
                request = self._last_request
            else:
                request = heartbeat_from_proto(message.heartbeat)
                self._last_in, self._last_request = message.heartbeat, request
            group = request.group
            response = await self._service.heartbeat(request)
        except SluiceError as err:
            # A malformed heartbeat (or NOT_COORDINATOR, STORAGE_ERROR) fails this message, not the
            # stream; the member reacts to the error as it would to the unary RPC's.
            self._recorder.record(err.code_name, started)
            self._follow(None)
            return pb.GroupStreamResponse(
                heartbeat=pb.GroupHeartbeatResponse(
                    member_id=message.heartbeat.member_id,
                    member_epoch=message.heartbeat.member_epoch,
                    error=err.to_proto(),
                )
            )
        self._follow(
            (group, response.member_id) if response.error is None and response.member_epoch > 0 else None
        )
        self._recorder.record("OK", started)
        if response != self._last_response or self._last_out is None:
            self._last_response = response
            self._last_out = pb.GroupStreamResponse(heartbeat=heartbeat_to_proto(response))
        return self._last_out

    def _follow(self, key: tuple[str, str] | None) -> None:
        """Be the watcher of the member this stream heartbeats for (none once it left or was refused)."""
        if key == self._watching:
            return
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        self._watching = key
        if key is not None:
            self._unwatch = self._service.watch(key[0], key[1], self._push)
