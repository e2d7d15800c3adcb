"""One event loop per ``Client`` that heartbeats every group member made on it.

A member's heartbeat work is a coroutine (``member.py``) on this loop, not a thread of its
own: its heartbeat stream is a ``grpc.aio`` call on the driver's one channel to the
coordinator, its timer is the loop's. So the thousandth consumer of a Client costs a few
coroutines and a stream on a channel that is already open, and the Client runs one thread
for all of its members' heartbeats, however many (docs/consumer.md, "Many consumers on one
Client"). With a thread per member (and sync gRPC's two more per stream) 1,000 consumers
took about 3,000 threads.

The loop starts with the first member and stops when the Client closes.

Caller: the Client (one per Client), the GroupMember (``submit``, ``call_soon``, ``stub``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import grpc

from sluice.common.client_security import ClientSecurity
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc, is_unimplemented
from sluice.errors import SluiceError
from sluice.v1 import coordinator_pb2, coordinator_pb2_grpc

__all__ = ["GroupDriver"]

log = logging.getLogger("sluice.consumer.driver")

T = TypeVar("T")


class GroupDriver:
    """An event-loop thread and one ``grpc.aio`` channel to the coordinator (the peer layer's
    ``AioPeers``). Thread-safe."""

    def __init__(
        self, coordinator: str, name: str = "sluice-group-driver", security: ClientSecurity | None = None
    ) -> None:
        self._address = coordinator
        #: The owning Client's TLS and token (None: the process's).
        self._security = security
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._peers: AioPeers | None = None
        self._stub: coordinator_pb2_grpc.CoordinatorAsyncStub | None = None
        self._closed = False
        #: Whether the coordinator implements ConsumerGroupStream (None: not known yet).
        self._streams: bool | None = None
        self._probe: asyncio.Lock | None = None
        self._probes = 0

    @property
    def stub(self) -> coordinator_pb2_grpc.CoordinatorAsyncStub:
        """The coordinator's stub on the driver's channel. Use from the loop only."""
        assert self._stub is not None, "the group driver is not started"
        return self._stub

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the loop (starting it on first use)."""
        loop = self._started()
        return asyncio.run_coroutine_threadsafe(coro, loop)

    async def streams_supported(self, rpc_timeout: float) -> bool | None:
        """Whether the coordinator implements ``ConsumerGroupStream`` (None: could not tell,
        e.g. it is unreachable). Probed once per driver with a stream that sends nothing.

        Why a probe, and not the first heartbeat on a stream: a coordinator without the
        method ends the call at once, and a ``grpc.aio`` write that loses that race
        replaces the call's UNIMPLEMENTED status with INTERNAL ("Internal error from
        Core"), which looks like a transport failure. The probe writes nothing (it half-closes
        at once), so its status is the server's. Loop only."""
        if self._streams is not None:
            return self._streams
        if self._probe is None:
            self._probe = asyncio.Lock()
        probes = self._probes
        async with self._probe:
            # A probe that failed while this member waited for it is not repeated by every waiter
            # (a thousand members starting while the coordinator is away would probe one by one).
            if self._streams is None and self._probes == probes:
                self._probes += 1
                call = self.stub.ConsumerGroupStream(_nothing(), timeout=rpc_timeout)
                try:
                    async for _ in call:
                        pass  # nothing was asked: the coordinator ends the call, OK
                    self._streams = True
                except grpc.RpcError as exc:
                    if is_unimplemented(exc):
                        self._streams = False
                    else:  # unreachable, timed out: the members find out on their own streams
                        log.debug("heartbeat stream probe failed: %s", error_from_rpc(exc))
        return self._streams

    def streams_unsupported(self) -> None:
        """A member's stream was refused as unimplemented: the others need not try. Loop only."""
        self._streams = False

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the loop soon, from any thread; dropped once the driver is closed."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to wake
            loop.call_soon_threadsafe(fn)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop (members are closed before) and close the channel. Idempotent."""
        with self._lock:
            self._closed = True
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            loop.call_soon_threadsafe(loop.stop)
        except RuntimeError:
            return
        if thread is not threading.current_thread():
            thread.join(timeout)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise SluiceError("the client is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(target=self._run, args=(loop, ready), name=self._name, daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    def _run(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._open())
        finally:
            ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(self._shutdown())
            except Exception:
                log.exception("closing the group driver failed")
            loop.close()

    async def _open(self) -> None:
        self._peers = AioPeers(security=self._security)
        self._stub = self._peers.coordinator(self._address)

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._peers is not None:
            await self._peers.close()


async def _nothing() -> AsyncIterator[coordinator_pb2.GroupStreamRequest]:
    """No requests: the probe half-closes at once."""
    return
    yield
