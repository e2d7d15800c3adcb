"""Following a continuous fetch on the wire protocol from an asyncio service, answer by answer.

The dispatcher's partition feeds read brokers with it. A continuous fetch (``docs/wire.md``) is
one request the broker answers again and again, from where each answer ended, so following a
partition that keeps up is nothing but reading answers. Reading them through a stream reader and
awaiting each one cost the dispatcher about a fifth of its CPU at a steady rate of one record per
answer: a coroutine, a task and a timeout per answer, two ``readexactly`` per frame and the task's
wake-up. :class:`FetchFollower` is instead an ``asyncio.BufferedProtocol``: the event loop reads
into a buffer, the frames are cut out and parsed in that read callback, and each answer is handed
to the owner's callback right there: no task, no future, no timer per answer.

What the owner gets in exchange is a callback contract: answers arrive in ``on_answer`` in order;
the first failure of any kind (connection lost, a refused hello, an error frame, a frame that makes
no sense, an answer that does not parse, no answer for too long) closes the connection and is
reported once in ``on_error`` as a typed error (BrokerNotAvailable when a retry may succeed); after
``close()`` nothing is reported at all. Reading pauses on request, for the owner's back-pressure:
the broker then stops fetching once the socket buffers are full.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable
from typing import cast

from google.protobuf.message import DecodeError

from sluice.common.client_security import ClientSecurity, process_security
from sluice.common.client_tls import client_ssl_context, server_hostname
from sluice.common.timeouts import within
from sluice.common.wire import (
    CONNECT_TIMEOUT_S,
    PROTOCOL_VERSION,
    FrameReader,
    FrameType,
    WireProtocolError,
    error_from_frame,
    frame,
    split_address,
)
from sluice.errors import AuthenticationError, BrokerNotAvailable, error_from_proto
from sluice.v1 import broker_pb2, wire_pb2

__all__ = ["FetchFollower"]


#: The one request a follower sends: its answers all echo this id.
_REQUEST_ID = 1

#: Bytes one socket read may bring.
READ_BUFFER_BYTES = 256 * 1024

_local = threading.local()


def _read_buffer() -> memoryview:
    """The receive buffer of this thread's event loop, shared by all its followers.

    A dispatcher follows every partition it serves, so a buffer per follower would cost memory per
    partition. Sharing is safe: the loop calls ``get_buffer``, reads into it and calls
    ``buffer_updated`` back to back on its own thread, and the frame reader copies what it keeps
    before that callback returns.
    """
    view: memoryview | None = getattr(_local, "buffer", None)
    if view is None:
        view = _local.buffer = memoryview(bytearray(READ_BUFFER_BYTES))
    return view


class FetchFollower(asyncio.BufferedProtocol):
    """One continuous fetch on a connection of its own to the broker's wire port at ``address``.

    ``open()`` connects; the hello, then the request, go out from the callbacks. Everything runs on
    the event loop's thread. ``timeout_s``: how long the broker may stay silent while reading is
    not paused (it answers at least every ``max_wait_ms``, with nothing if need be).
    """

    def __init__(
        self,
        address: str,
        request: broker_pb2.FetchRequest,
        on_answer: Callable[[broker_pb2.FetchResponse], None],
        on_error: Callable[[Exception], None],
        timeout_s: float,
        client_id: str = "",
        security: ClientSecurity | None = None,
    ) -> None:
        self.address = address
        self._endpoint = split_address(address)
        request.continuous = True
        request.request_id = _REQUEST_ID
        self._request = frame(FrameType.FETCH, request.SerializeToString())
        self._client_id = client_id
        #: TLS and the token (None: the process's own, ``process_security()``).
        self._security = security if security is not None else process_security()
        self._hello = b""  # built at open(): a fresh token per connection
        self._on_answer = on_answer
        self._on_error = on_error
        self._timeout = timeout_s
        self._reader = FrameReader()
        self._view = memoryview(b"")  # the loop thread's buffer, from open()
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._greeted = False
        #: Closed by its owner or by a failure: no callback runs any more.
        self.closed = False
        #: Reading paused by the owner (``pause``), not by a failure.
        self.paused = False
        #: Frames read in the same socket read as an answer after which the owner paused: they
        #: wait for ``resume`` (a pause means no more answers, not only no more reads).
        self._held: list[tuple[int, bytes]] = []
        self._last_answer = 0.0
        self._timer: asyncio.TimerHandle | None = None

    async def open(self) -> None:
        """Connect. A failure raises a typed error here and is not reported to ``on_error``."""
        loop = self._loop = asyncio.get_running_loop()
        self._view = _read_buffer()
        security = self._security
        metadata = dict(security.metadata())
        hello = wire_pb2.WireHello(version=PROTOCOL_VERSION, client_id=self._client_id, metadata=metadata)
        self._hello = frame(FrameType.HELLO, hello.SerializeToString())
        host, port = self._endpoint
        tls = security.tls
        try:
            if tls is None:
                connecting = loop.create_connection(lambda: self, host, port)
            else:
                connecting = loop.create_connection(
                    lambda: self,
                    host,
                    port,
                    ssl=client_ssl_context(tls),
                    server_hostname=server_hostname(tls, host),
                )
            await within(connecting, CONNECT_TIMEOUT_S)
        except ssl.SSLError as exc:
            self.close()
            why = exc.reason or exc
            raise AuthenticationError(f"broker {self.address}: TLS handshake failed: {why}") from exc
        except (OSError, TimeoutError) as exc:
            self.close()
            raise BrokerNotAvailable(f"broker {self.address}: {exc!r}") from exc

    def close(self) -> None:
        self.closed = True
        self._held = []
        self._stop_timer()
        if self._transport is not None:
            self._transport.close()

    def pause(self) -> None:
        """Stop reading (and stop expecting answers) until ``resume``."""
        if self.paused or self.closed:
            return
        self.paused = True
        self._stop_timer()
        if self._transport is not None:
            self._transport.pause_reading()

    def resume(self) -> None:
        if not self.paused or self.closed:
            return
        self.paused = False
        if self._transport is not None:
            self._transport.resume_reading()
            self._watch()
        if self._held:
            # Not from here: the owner resumes from its own callbacks, and an answer handed to it
            # now would re-enter them.
            assert self._loop is not None
            self._loop.call_soon(self._release)

    # ---- asyncio.BufferedProtocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport, so no isinstance).
        self._transport = t = cast(asyncio.Transport, transport)
        if self.closed:  # closed while connecting
            t.close()
            return
        t.write(self._hello)
        if self.paused:
            t.pause_reading()
        else:
            self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        why = f"connection lost: {exc!r}" if exc is not None else "the broker closed the connection"
        self._fail(BrokerNotAvailable(f"broker {self.address}: {why}"))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        if self.closed:
            return
        try:
            frames = self._reader.feed(self._view[:nbytes])
        except WireProtocolError as exc:
            self._fail(BrokerNotAvailable(f"broker {self.address}: {exc.message}"))
            return
        if self._held:
            frames = self._held + frames
            self._held = []
        self._frames(frames)

    # ---- frames ---------------------------------------------------------------------------

    def _release(self) -> None:
        frames, self._held = self._held, []
        self._frames(frames)

    def _frames(self, frames: list[tuple[int, bytes]]) -> None:
        for i, (kind, payload) in enumerate(frames):
            if self.closed:
                return
            if self.paused:
                self._held = frames[i:]
                return
            if kind == FrameType.FETCH and self._greeted:
                try:
                    answer = broker_pb2.FetchResponse.FromString(payload)
                except DecodeError as exc:
                    self._fail(
                        BrokerNotAvailable(
                            f"broker {self.address}: a fetch answer that does not parse: {exc}"
                        )
                    )
                    return
                if answer.request_id != _REQUEST_ID:
                    self._fail(
                        BrokerNotAvailable(
                            f"broker {self.address}: answer to request {answer.request_id}, "
                            f"expected {_REQUEST_ID}"
                        )
                    )
                    return
                assert self._loop is not None
                self._last_answer = self._loop.time()
                try:
                    self._on_answer(answer)
                except Exception as exc:  # the owner's bug: it must not pass unseen
                    self._fail(exc)
                    return
            elif kind == FrameType.HELLO and not self._greeted:
                self._hello_answer(payload)
            elif kind == FrameType.ERROR:
                try:
                    err: Exception = error_from_frame(payload, f"broker {self.address}")
                except DecodeError as exc:
                    err = BrokerNotAvailable(
                        f"broker {self.address}: an error frame that does not parse: {exc}"
                    )
                self._fail(err)
                return
            else:
                self._fail(BrokerNotAvailable(f"broker {self.address}: unexpected frame type {kind}"))
                return

    def _hello_answer(self, payload: bytes) -> None:
        try:
            answer = wire_pb2.WireHelloResponse.FromString(payload)
        except DecodeError as exc:
            self._fail(
                BrokerNotAvailable(f"broker {self.address}: a hello answer that does not parse: {exc}")
            )
            return
        refusal = error_from_proto(answer.error)
        if refusal is not None:
            self._fail(refusal)
            return
        self._greeted = True
        assert self._transport is not None
        self._transport.write(self._request)

    def _fail(self, err: Exception) -> None:
        if self.closed:
            return
        self.close()
        self._on_error(err)

    # ---- liveness -------------------------------------------------------------------------

    def _watch(self) -> None:
        """Expect an answer within the timeout from now. One timer for the follower's life, which
        re-arms itself from the last answer's time: a timer per answer would cost more than the
        answer."""
        assert self._loop is not None
        self._last_answer = self._loop.time()
        if self._timer is None:
            self._timer = self._loop.call_later(self._timeout, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.closed or self.paused:
            return
        assert self._loop is not None
        silent = self._loop.time() - self._last_answer
        if silent >= self._timeout:
            self._fail(BrokerNotAvailable(f"broker {self.address} sent no fetch answer for {silent:.1f} s"))
            return
        self._timer = self._loop.call_later(self._timeout - silent, self._check)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
