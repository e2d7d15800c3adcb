"""A wire protocol version-1 client, for the tests of the broker's version-1 service.

The SDK shares one connection per broker and client (version 2, ``sluice.client.shared_wire``);
brokers still serve version 1 (one TCP connection per broker and kind), and these tests keep it
working. :class:`WireConnection` keeps the contract of ``sluice.client.streams.RequestStream``:
``send(request, timeout, on_done)``, answers matched by ``request_id``, every request still waiting
failed with a typed retriable error when the connection ends, a request past its deadline ends the
connection; ``follow`` keeps a continuous fetch. One reader thread per connection.
"""

from __future__ import annotations

import collections
import logging
import math
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf.message import DecodeError

from sluice.client.streams import Callback
from sluice.client.wire import greet_and_block, shutdown
from sluice.common.wire import (
    CONNECT_TIMEOUT_S,
    PROTOCOL_VERSION,
    FrameReader,
    FrameType,
    WireProtocolError,
    WireRequest,
    error_from_frame,
    frame_parts,
    split_address,
)
from sluice.errors import BrokerNotAvailable, RequestTimedOut, SluiceError
from sluice.v1 import wire_pb2

__all__ = ["WireConnection"]

log = logging.getLogger("tests.wire_v1_client")


Req = TypeVar("Req", bound=WireRequest)
Resp = TypeVar("Resp")

_RECV_BYTES = 1 << 20


@dataclass(slots=True)
class _Waiting:
    request_id: int
    deadline: float
    #: An ordinary request's callback returns nothing; a followed one's says whether it goes on.
    on_done: Callable[[Any], bool | None]
    #: A followed request (``follow``): answered again and again, each answer due within this
    #: many seconds of the previous one. 0 for an ordinary request, answered once.
    span: float = 0.0


class _Link:
    """One TCP connection and the requests it still owes answers to."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        #: Frames sent before the hello was answered; None once they went out.
        self.pending: list[bytes] | None = []
        self.waiting: collections.deque[_Waiting] = collections.deque()
        self.ended = False


class WireConnection(Generic[Req, Resp]):
    """Requests of one kind to one broker; see the module docstring.

    Thread-safe: ``send`` from any thread. Callbacks run on the reader thread; they must be
    quick and must not call back into the connection.
    """

    def __init__(
        self,
        address: str | Callable[[], str | None],
        kind: FrameType,
        response_type: type[Resp],
        name: str,
        *,
        client_id: str = "",
        metadata: dict[str, str] | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ) -> None:
        #: Where to connect, asked at every connect: a broker restarted on another wire port is
        #: found through fresh metadata (None: it no longer advertises one).
        self._address = address if callable(address) else (lambda: address)
        self._kind = kind
        self._response_type: Any = response_type
        self._name = name
        self._hello = wire_pb2.WireHello(
            version=PROTOCOL_VERSION, client_id=client_id, metadata=metadata or {}
        ).SerializeToString()
        self._connect_timeout = connect_timeout
        #: Guards the link and its waiting queue; never held across a blocking call.
        self._lock = threading.Lock()
        #: Serializes writes, so frames leave in the order their requests were queued. The
        #: reader thread never takes it: a write blocked on a full socket cannot stop the
        #: answers that would unblock it from being read.
        self._send_lock = threading.Lock()
        self._link: _Link | None = None
        self._next_id = 1
        self._closed = False
        #: How long the reader sleeps while nothing waits: the shortest request timeout seen. A
        #: request sent while it sleeps has a deadline at or after its wake-up, so the reader needs
        #: no wake-up per request, and an idle connection no periodic one. (The first send sets it
        #: before the reader, which that send starts, looks.)
        self._idle_span = math.inf

    def send(self, request: Req, timeout: float, on_done: Callback) -> None:
        """Send ``request``; ``on_done`` later gets its response or a SluiceError (never both)."""
        self._submit(request, timeout, on_done, follow=False)

    def follow(self, request: Req, span: float, on_answer: Callable[[Any], bool]) -> None:
        """Send a request the server answers again and again (a continuous fetch, ``docs/wire.md``).

        ``on_answer`` gets every answer, and returns False for the one that ends it (the server
        stops following after an answer with an error); a SluiceError, once, ends it too. Each
        answer is due within ``span`` seconds of the previous one (counted from when
        ``on_answer`` returned, so a callback that waits for room holds the deadline back with
        the reading). A later request on the connection replaces a followed one: the first answer
        to the later one ends it, and answers to it that were already on the way still come.

        ``on_answer`` runs on the reader thread and may block it: reading stops meanwhile, and so,
        once the socket's buffers fill, does the server. That is this connection's back-pressure.
        """
        self._submit(request, span, on_answer, follow=True)

    def _submit(
        self, request: Req, timeout: float, on_done: Callable[[Any], bool | None], follow: bool
    ) -> None:
        with self._send_lock:
            with self._lock:
                if self._closed:
                    link = None
                else:
                    link = self._link
                    if link is None or link.ended:
                        link = self._open()
                    request.request_id = self._next_id
                    self._next_id += 1
                    link.waiting.append(
                        _Waiting(
                            request.request_id,
                            time.monotonic() + timeout,
                            on_done,
                            timeout if follow else 0.0,
                        )
                    )
                    self._idle_span = min(self._idle_span, timeout)
            if link is not None:
                self._write(link, frame_parts(self._kind, request.SerializeToString()))
                return
        # Outside the locks: the callback may send again (on another connection).
        on_done(BrokerNotAvailable(f"{self._name}: the connection is closed"))

    def _write(self, link: _Link, parts: tuple[bytes, ...]) -> None:
        """Send lock held: write now, or queue behind the hello while connecting."""
        if link.pending is not None:
            link.pending += parts
            return
        try:
            assert link.sock is not None
            for part in parts:
                link.sock.sendall(part)
        except OSError:
            # The reader sees the connection end too, and fails what waits (this included).
            shutdown(link.sock)

    def close(self) -> None:
        """End the connection; requests still waiting fail with BrokerNotAvailable."""
        with self._lock:
            self._closed = True
            link, self._link = self._link, None
        if link is not None:
            shutdown(link.sock)
            self._end(link, BrokerNotAvailable(f"{self._name}: the connection was closed"))

    # ---- internals ------------------------------------------------------------------------

    def _open(self) -> _Link:
        """A new link (lock held); its reader thread connects."""
        link = self._link = _Link()
        threading.Thread(target=self._run, args=(link,), name=f"sluice-{self._name}", daemon=True).start()
        return link

    def _run(self, link: _Link) -> None:
        error: SluiceError
        try:
            sock = self._connect(link)
            self._read(link, sock)
            error = BrokerNotAvailable(f"{self._name}: the broker closed the connection")
        except WireProtocolError as exc:
            # The broker broke the protocol (never expected): what waits may succeed on a new
            # connection, so it fails retriable, as an unreachable broker's requests do.
            log.error("%s: %s; reconnecting", self._name, exc.message)
            error = BrokerNotAvailable(f"{self._name}: {exc.message}")
        except SluiceError as exc:
            error = exc
        except (OSError, DecodeError) as exc:
            error = BrokerNotAvailable(f"{self._name}: {exc}")
        if link.sock is not None:
            shutdown(link.sock)
            link.sock.close()
        self._end(link, error)

    def _connect(self, link: _Link) -> socket.socket:
        address = self._address()
        if address is None:
            raise BrokerNotAvailable(f"{self._name}: the broker no longer advertises a wire port")
        sock = link.sock = socket.create_connection(split_address(address), timeout=self._connect_timeout)
        if link.ended:  # closed while connecting
            raise BrokerNotAvailable(f"{self._name}: the connection was closed")
        greet_and_block(sock, self._hello, self._name)
        with self._send_lock:
            pending, link.pending = link.pending or [], None
            if pending:
                sock.sendall(b"".join(pending))
        return sock

    def _read(self, link: _Link, sock: socket.socket) -> None:
        reader = FrameReader()
        response_type = self._response_type
        kind_expected = self._kind
        # The socket stays blocking (a timeout on it would also bound the senders' writes);
        # deadlines are kept by polling with a timeout before each receive.
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        chunk = bytearray(_RECV_BYTES)
        view = memoryview(chunk)
        while True:
            with self._lock:
                head = link.waiting[0] if link.waiting else None
                span = self._idle_span
            now = time.monotonic()
            if head is None:
                wait = span
            elif head.deadline <= now:
                raise RequestTimedOut(f"{self._name}: no answer within the request's timeout")
            else:
                wait = head.deadline - now
            if not poller.poll(None if math.isinf(wait) else wait * 1000 + 1):
                continue
            n = sock.recv_into(chunk)
            if not n:
                return
            for kind, payload in reader.feed(view[:n]):
                if kind != kind_expected:
                    if kind == FrameType.ERROR:
                        raise error_from_frame(payload, self._name)
                    raise WireProtocolError(f"unexpected frame type {kind}")
                response = response_type.FromString(payload)
                head = self._answered(link, response.request_id)
                if head is None:
                    return  # closed meanwhile: what it owed was failed already
                if not head.span:
                    head.on_done(response)
                    continue
                if head.on_done(response) is False:
                    with self._lock:
                        if link.waiting and link.waiting[0] is head:
                            link.waiting.popleft()
                else:
                    head.deadline = time.monotonic() + head.span

    def _answered(self, link: _Link, request_id: int) -> _Waiting | None:
        """The request an answer belongs to: the oldest waiting one, which an ordinary request
        leaves as it is answered and a followed one as soon as a later request is answered.

        None when the link was ended (``close()`` on another thread) before the answer was read:
        ``_end`` already failed every request it owed, so answers still in the socket's buffer
        belong to nobody and are dropped. (Taking them for a broker's protocol error logged a
        bogus "answer to request N arrived, expected none" after every fetcher close that raced
        a pipelined fetch.)"""
        with self._lock:
            if link.ended:
                return None
            waiting = link.waiting
            # Followed requests ahead of the one answered were replaced by it. They leave only
            # once the answer is known to be in order: else ``_end`` still owes them the error.
            replaced = 0
            while replaced < len(waiting) - 1:
                ahead = waiting[replaced]
                if not ahead.span or ahead.request_id >= request_id:
                    break
                replaced += 1
            head = waiting[replaced] if waiting else None
            if head is None or head.request_id != request_id:
                expected = "none" if not waiting else str(waiting[0].request_id)
                raise WireProtocolError(f"answer to request {request_id} arrived, expected {expected}")
            for _ in range(replaced):
                waiting.popleft()
            if not head.span:
                waiting.popleft()
            return head

    def _end(self, link: _Link, error: SluiceError) -> None:
        """The connection is over: every request it owes an answer fails with ``error``."""
        with self._lock:
            if link.ended and not link.waiting:
                return
            link.ended = True
            if self._link is link:
                self._link = None
            waiting = list(link.waiting)
            link.waiting.clear()
        with self._send_lock:
            link.pending = None
        if waiting and not isinstance(error, BrokerNotAvailable | RequestTimedOut):
            log.warning("%s: connection failed: %s", self._name, error)
        for w in waiting:
            w.on_done(error)
