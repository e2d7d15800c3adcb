"""One wire connection per broker, shared by every producer and fetcher of a ``Client``.

Protocol version 2 (``docs/wire.md``, "Lanes"): produce frames are answered in order on the
connection, as in version 1; fetches travel in *lanes*, one per fetcher and broker, each
answered in order and followed (a continuous fetch) independently of the others. A
:class:`ProduceLink` and a :class:`FetchLane` are cheap views of the connection with the
``send``/``close`` contract of ``client.streams.RequestStream``; ``client.links`` hands them
out. So 1,000 consumers of one Client cost each broker one connection, not 1,000.

Threads: ``send`` writes the frame from the caller's thread (under one send lock, so frames
leave whole and in order); one reader thread per connection reads every answer and settles
it by lane and ``request_id``. The reader never writes and never blocks on an owner: a
followed lane's answers go to its owner's queue at once, and the broker sends a lane only as
many answers as its owner granted room for (``FetchLane.follow``'s ``window``, topped up by
``FetchLane.grant``). One owner that stops reading stops its own lane and nothing else.

Failures are the connection's: a request past its deadline, an answer out of order or the
broker closing fails every request it owes with a typed retriable error (as a version-1
connection does), and the next send connects again, to the wire address the latest metadata
gives.
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
from typing import Any

from google.protobuf.message import DecodeError

from sluice.client.streams import Callback
from sluice.client.wire import greet, hello_bytes, open_socket, shutdown
from sluice.common.client_security import ClientSecurity, retriable_refusal
from sluice.common.client_tls import share
from sluice.common.wire import (
    CONNECT_TIMEOUT_S,
    LANE,
    LANE_CREDIT,
    LANES_VERSION,
    FrameReader,
    FrameType,
    WireProtocolError,
    WireRequest,
    error_from_frame,
    frame_parts,
    has_records,
    lane_frame_parts,
    split_address,
)
from sluice.errors import (
    BrokerNotAvailable,
    CredentialsError,
    InvalidRequest,
    RequestTimedOut,
    SluiceError,
)
from sluice.v1 import broker_pb2

__all__ = ["FetchLane", "ProduceLink", "SharedConnection"]

log = logging.getLogger("sluice.client.wire")

_RECV_BYTES = 1 << 20


@dataclass(slots=True)
class _Waiting:
    request_id: int
    deadline: float
    #: An ordinary request's callback returns nothing; a followed one's says whether it goes on.
    on_done: Callable[[Any], bool | None]
    #: Who sent it (``close()`` fails its owner's requests and leaves the others').
    owner: object
    #: A followed request: each answer due within this many seconds of the previous one while
    #: the broker may send it one (``credit``). 0 for an ordinary request, answered once.
    span: float = 0.0
    #: Answers the broker may still send a followed request (its window, plus grants, less answers).
    credit: int = 0
    #: Its outcome was given (an ordinary request's answer, or its owner closed and it was
    #: failed): nothing more goes to ``on_done``.
    settled: bool = False


class _Link:
    """One TCP connection and the requests it still owes answers to."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        #: Frames sent before the hello was answered; None once they went out.
        self.pending: list[bytes] | None = []
        self.produces: collections.deque[_Waiting] = collections.deque()
        #: Per lane with something waiting: its requests, oldest first.
        self.lanes: dict[int, collections.deque[_Waiting]] = {}
        #: No deadline is due before this (senders lower it; the reader's scan sets it).
        self.next_check = math.inf
        self.ended = False
        #: TLS: a send writes one joined buffer (one TLS record, not one per frame part).
        self.join = False


class SharedConnection:
    """All produce and fetch requests of one client to one broker; see the module docstring."""

    def __init__(
        self,
        address: Callable[[], str | None],
        name: str,
        *,
        client_id: str = "",
        security: ClientSecurity | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ) -> None:
        #: Where to connect, asked at every connect: a broker restarted on another wire port is
        #: found through fresh metadata (None: it no longer advertises one).
        self._address = address
        self._name = name
        self._client_id = client_id
        #: TLS and the token of every (re)connection; the hello is built per connection (a fresh token).
        self._security = security
        self._connect_timeout = connect_timeout
        #: Guards the link and what waits on it; never held across a blocking call.
        self._lock = threading.Lock()
        #: Serializes writes (frames leave whole and in order). The reader never takes it.
        self._send_lock = threading.Lock()
        self._link: _Link | None = None
        self._next_id = 1
        self._next_lane = 1
        self._closed = False
        #: The shortest timeout seen: the reader sleeps at most this long, so a request sent
        #: while it sleeps is never checked later than its deadline.
        self._idle_span = math.inf

    def produce_link(self) -> ProduceLink:
        return ProduceLink(self)

    def fetch_lane(self) -> FetchLane:
        with self._lock:
            lane = self._next_lane
            self._next_lane += 1
        return FetchLane(self, lane)

    def close(self) -> None:
        """End the connection; requests still waiting fail with BrokerNotAvailable."""
        with self._lock:
            self._closed = True
            link, self._link = self._link, None
        if link is not None:
            shutdown(link.sock)
            self._end(link, BrokerNotAvailable(f"{self._name}: the connection was closed"))

    # ---- sending --------------------------------------------------------------------------

    def submit(
        self,
        owner: object,
        request: WireRequest,
        timeout: float,
        on_done: Callable[[Any], bool | None],
        lane: int = 0,
        window: int = 0,
    ) -> None:
        """Send a produce (``lane`` 0) or a fetch on ``lane`` (followed when ``window`` > 0)."""
        with self._send_lock:
            with self._lock:
                link = None if self._closed else self._link
                if not self._closed and (link is None or link.ended):
                    link = self._open()
                if link is not None:
                    request.request_id = self._next_id
                    self._next_id += 1
                    waiting = _Waiting(
                        request.request_id,
                        time.monotonic() + timeout,
                        on_done,
                        owner,
                        timeout if window else 0.0,
                        window,
                    )
                    if lane:
                        link.lanes.setdefault(lane, collections.deque()).append(waiting)
                    else:
                        link.produces.append(waiting)
                    link.next_check = min(link.next_check, waiting.deadline)
                    self._idle_span = min(self._idle_span, timeout)
            if link is not None:
                payload = request.SerializeToString()
                if lane:
                    parts = lane_frame_parts(FrameType.FETCH_LANE, LANE_CREDIT.pack(lane, window), payload)
                else:
                    parts = frame_parts(FrameType.PRODUCE, payload)
                self._write(link, parts)
                return
        # Outside the locks: the callback may send again (on another connection).
        on_done(BrokerNotAvailable(f"{self._name}: the connection is closed"))

    def grant(self, lane: int, n: int) -> None:
        """The lane's owner has room for ``n`` more answers of its followed fetch."""
        with self._send_lock:
            with self._lock:
                link = self._link
                queue = link.lanes.get(lane) if link is not None and not link.ended else None
                if link is None or not queue:
                    return  # nothing followed there (a new connection knows nothing of the lane)
                followed = queue[-1]
                if followed.span:
                    if followed.credit <= 0 < followed.credit + n:
                        followed.deadline = time.monotonic() + followed.span
                        link.next_check = min(link.next_check, followed.deadline)
                    followed.credit += n
            self._write(link, (frame_parts(FrameType.LANE_CREDIT, LANE_CREDIT.pack(lane, n))[0],))

    def cancel(self, owner: object, lane: int = 0) -> None:
        """``owner`` is gone: fail what it waits for (BrokerNotAvailable), drop its answers, and
        end its lane on the broker."""
        failed: list[_Waiting] = []
        with self._send_lock:
            with self._lock:
                link = self._link
                if link is None or link.ended:
                    return
                queue = link.lanes.pop(lane, None) if lane else link.produces
                for w in queue or ():
                    if w.owner is owner and not w.settled:
                        w.settled = True
                        failed.append(w)
            if lane:
                self._write(link, frame_parts(FrameType.LANE_END, LANE.pack(lane)))
        error = BrokerNotAvailable(f"{self._name}: closed")
        for w in failed:
            w.on_done(error)

    def _write(self, link: _Link, parts: tuple[bytes, ...]) -> None:
        """Send lock held: write now, or queue behind the hello while connecting."""
        if link.pending is not None:
            link.pending += parts
            return
        try:
            assert link.sock is not None
            if link.join:
                link.sock.sendall(b"".join(parts))
            else:
                for part in parts:
                    link.sock.sendall(part)
        except OSError:
            # The reader sees the connection end too, and fails what waits (this included).
            shutdown(link.sock)

    # ---- the reader thread ----------------------------------------------------------------

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
        security = self._security
        tls = security.tls if security is not None else None
        sock = link.sock = open_socket(split_address(address), self._connect_timeout, tls, self._name)
        link.join = tls is not None
        if link.ended:  # closed while connecting
            raise BrokerNotAvailable(f"{self._name}: the connection was closed")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            answer = greet(sock, hello_bytes(LANES_VERSION, self._client_id, security), self._name)
        except CredentialsError as exc:
            raise retriable_refusal(security, exc) from None
        if answer.version < LANES_VERSION:
            raise InvalidRequest(
                f"{self._name}: the broker speaks wire protocol version {answer.version}, this SDK needs "
                f"{LANES_VERSION} (shared connections): upgrade the broker first, or set "
                "SLUICE_CLIENT_TRANSPORT=grpc"
            )
        sock.settimeout(None)
        share(sock)  # TLS: the reader and the senders take turns on the session
        with self._send_lock:
            pending, link.pending = link.pending or [], None
            if pending:
                sock.sendall(b"".join(pending))
        return sock

    def _read(self, link: _Link, sock: socket.socket) -> None:
        reader = FrameReader()
        # The socket stays blocking (a timeout on it would also bound the senders' writes);
        # deadlines are kept by polling with a timeout before each receive.
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        chunk = bytearray(_RECV_BYTES)
        view = memoryview(chunk)
        # TLS: bytes already decrypted inside the SSL object do not make the socket readable.
        pending: Callable[[], int] | None = getattr(sock, "pending", None)
        while True:
            now = time.monotonic()
            with self._lock:
                if link.next_check <= now:
                    self._check_deadlines(link, now)
                wait = min(link.next_check - now, self._idle_span)
            if (pending is None or not pending()) and not poller.poll(
                None if math.isinf(wait) else wait * 1000 + 1
            ):
                continue
            n = sock.recv_into(chunk)
            if not n:
                return
            for kind, payload in reader.feed(view[:n]):
                if kind == FrameType.PRODUCE:
                    self._produced(link, broker_pb2.ProduceResponse.FromString(payload))
                elif kind == FrameType.FETCH_LANE:
                    lane = LANE.unpack_from(payload)[0]
                    self._fetched(
                        link,
                        lane,
                        broker_pb2.FetchResponse.FromString(memoryview(payload)[LANE.size :]),  # type: ignore[arg-type]
                    )
                elif kind == FrameType.ERROR:
                    raise error_from_frame(payload, self._name)
                else:
                    raise WireProtocolError(f"unexpected frame type {kind}")
                if link.ended:
                    return  # closed meanwhile: what it owed was failed already

    def _check_deadlines(self, link: _Link, now: float) -> None:
        """Lock held: raise if a request is past its deadline, else note the next one."""
        # Every request of a lane (one or two: a followed fetch and the one replacing it), and
        # the oldest produce: produces are answered in order, so a later one cannot come first.
        due = min((w.deadline for queue in link.lanes.values() for w in queue), default=math.inf)
        if link.produces:
            due = min(due, link.produces[0].deadline)
        if due <= now:
            raise RequestTimedOut(f"{self._name}: no answer within the request's timeout")
        link.next_check = due

    def _produced(self, link: _Link, response: broker_pb2.ProduceResponse) -> None:
        with self._lock:
            if link.ended:
                return
            head = link.produces.popleft() if link.produces else None
            if head is None or head.request_id != response.request_id:
                expected = "none" if head is None else str(head.request_id)
                raise WireProtocolError(
                    f"answer to produce {response.request_id} arrived, expected {expected}"
                )
            deliver = not head.settled
            head.settled = True
        if deliver:
            head.on_done(response)

    def _fetched(self, link: _Link, lane: int, response: broker_pb2.FetchResponse) -> None:
        """A lane's answer goes to the oldest request waiting there, which an ordinary request
        leaves as it is answered and a followed one as soon as a later request is answered."""
        with self._lock:
            if link.ended:
                return
            waiting = link.lanes.get(lane)
            if not waiting:
                return  # the lane was closed (``cancel``): its answers still on the way are nobody's
            replaced = 0
            while replaced < len(waiting) - 1:
                ahead = waiting[replaced]
                if not ahead.span or ahead.request_id >= response.request_id:
                    break
                replaced += 1
            head = waiting[replaced]
            if head.request_id != response.request_id:
                raise WireProtocolError(
                    f"lane {lane}: answer to request {response.request_id} arrived, "
                    f"expected {waiting[0].request_id}"
                )
            for _ in range(replaced):
                waiting.popleft()
            if head.span:
                if has_records(response):
                    head.credit -= 1
                # No answer is due while the broker may send none: the owner has not made room.
                head.deadline = time.monotonic() + head.span if head.credit > 0 else math.inf
            else:
                waiting.popleft()
            if not waiting:
                del link.lanes[lane]
            if head.settled:
                return
            head.settled = not head.span
        if head.on_done(response) is False:
            with self._lock:
                waiting = link.lanes.get(lane)
                if waiting and waiting[0] is head:
                    waiting.popleft()
                    if not waiting:
                        del link.lanes[lane]

    def _end(self, link: _Link, error: SluiceError) -> None:
        """The connection is over: every request it owes an answer fails with ``error``."""
        with self._lock:
            owed = list(link.produces)
            for queue in link.lanes.values():
                owed += queue
            if link.ended and not owed:
                return
            link.ended = True
            if self._link is link:
                self._link = None
            link.produces.clear()
            link.lanes.clear()
        with self._send_lock:
            link.pending = None
        if owed and not isinstance(error, BrokerNotAvailable | RequestTimedOut):
            log.warning("%s: connection failed: %s", self._name, error)
        for w in owed:
            if not w.settled:
                w.on_done(error)


class ProduceLink:
    """A producer's view of the shared connection (``BrokerLink``)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: SharedConnection) -> None:
        self._conn = conn

    def send(self, request: Any, timeout: float, on_done: Callback) -> None:
        self._conn.submit(self, request, timeout, on_done)

    def close(self) -> None:
        """Fail this producer's requests still waiting; the connection goes on for the others."""
        self._conn.cancel(self)


class FetchLane:
    """A fetcher's lane on the shared connection (``BrokerLink``, and it can follow)."""

    __slots__ = ("_conn", "_every", "_owed", "lane", "sent")

    def __init__(self, conn: SharedConnection, lane: int) -> None:
        self._conn = conn
        self.lane = lane
        #: Fetch requests sent on the lane (a followed one counts once, however often answered).
        self.sent = 0
        self._owed = 0  # answers taken, not granted back yet
        self._every = 1  # how many make one LANE_CREDIT frame

    def send(self, request: Any, timeout: float, on_done: Callback) -> None:
        """One fetch, answered once (a followed fetch on the lane is replaced by it)."""
        self.sent += 1
        self._conn.submit(self, request, timeout, on_done, self.lane)

    def follow(self, request: Any, span: float, window: int, on_answer: Callable[[Any], bool]) -> None:
        """Send a continuous fetch: ``on_answer`` gets every answer (on the reader thread; it must
        not block) and returns False for the one that ends it; a SluiceError, once, ends it too.
        The broker sends at most ``window`` answers, and ``grant(n)`` more: the owner grants as it
        takes answers, so an owner that stops taking them holds ``window`` answers at most, and
        its lane waits without holding up the connection. Each answer is due within ``span``
        seconds of the previous one, or of the grant that made room for it. Grants go out
        ``window - 1`` at a time (one LANE_CREDIT frame, a broker wake-up, for several answers); the
        broker still has credit for one answer whenever the owner took all it was sent."""
        self.sent += 1
        self._owed = 0
        self._every = max(window - 1, 1)
        self._conn.submit(self, request, span, on_answer, self.lane, max(window, 1))

    def grant(self, n: int = 1) -> None:
        """The owner took ``n`` answers: room for as many more, sent once ``window - 1`` are owed."""
        self._owed += n
        if self._owed >= self._every:
            n, self._owed = self._owed, 0
            self._conn.grant(self.lane, n)

    def close(self) -> None:
        """End the lane: its waiting requests fail (BrokerNotAvailable), the broker stops it."""
        self._conn.cancel(self, self.lane)
