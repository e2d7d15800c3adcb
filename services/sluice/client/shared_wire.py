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
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from google.protobuf.message import DecodeError

from sluice.client.wire import connection_failure, greet, hello_bytes, open_socket, shutdown
from sluice.client.wire_lanes import FetchLane, ProduceLink
from sluice.client.wire_link import Link, Waiting
from sluice.common.client_security import ClientSecurity, retriable_refusal
from sluice.common.client_tls import share
from sluice.common.wire import (
    CONNECT_TIMEOUT_S,
    LANE,
    LANE_CREDIT,
    LANES_VERSION,
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

__all__ = ["SharedConnection"]

log = logging.getLogger("sluice.client.wire")


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
        #: Who reads the socket (``Link.reading``) changes hands under the lock: the reader thread
        #: and driving owners wait on it for their turn.
        self._turn = threading.Condition(self._lock)
        #: Serializes writes (frames leave whole and in order). The reader never takes it.
        self._send_lock = threading.Lock()
        self._link: Link | None = None
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
                    waiting = Waiting(
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
                    if not link.reading:
                        self._turn.notify_all()  # the reader thread rests: this one it must read
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
        failed: list[Waiting] = []
        with self._send_lock:
            with self._lock:
                link = self._link
                if link is None or link.ended:
                    return
                queue = link.lanes.pop(lane, None) if lane else link.produces
                driven = lane in link.driven
                link.driven.discard(lane)
                for w in queue or ():
                    if w.owner is owner and not w.settled:
                        w.settled = True
                        failed.append(w)
            if lane:
                self._write(link, frame_parts(FrameType.LANE_END, LANE.pack(lane)))
        error = BrokerNotAvailable(f"{self._name}: closed")
        for w in failed:
            w.on_done(error)
        if driven:
            with self._lock:
                link.interrupt()  # its owner may wait in poll: the failure just queued is its answer

    def _write(self, link: Link, parts: tuple[bytes, ...]) -> None:
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

    def _open(self) -> Link:
        """A new link (lock held); its reader thread connects."""
        link = self._link = Link()
        threading.Thread(target=self._run, args=(link,), name=f"sluice-{self._name}", daemon=True).start()
        return link

    def _run(self, link: Link) -> None:
        error: SluiceError
        try:
            sock = self._connect(link)
            self._read(link, sock)
            error = self._closed_by_broker()
        except (SluiceError, OSError, DecodeError) as exc:
            error = connection_failure(self._name, exc)
        if link.sock is not None:
            shutdown(link.sock)
            link.sock.close()
        self._end(link, error)
        with self._lock:
            link.close_interrupts()

    def _connect(self, link: Link) -> socket.socket:
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
        link.readable(sock)
        with self._send_lock:
            pending, link.pending = link.pending or [], None
            if pending:
                sock.sendall(b"".join(pending))
        return sock

    def _closed_by_broker(self) -> SluiceError:
        return BrokerNotAvailable(f"{self._name}: the broker closed the connection")

    def _read(self, link: Link, sock: socket.socket) -> None:
        """The reader thread: read in turns, resting while an owner drives or only driven lanes are owed."""
        while True:
            with self._lock:
                link.release()
                link.thread_reading = False
                if link.drivers:
                    self._turn.notify_all()  # a waiting owner takes the turn
                while not link.ended and link.thread_may_rest():
                    self._turn.wait()
                if link.ended:
                    return
                link.take()
                link.thread_reading = True
            if not self._round(link, sock, math.inf):
                return

    def drive(self, lane: int, ready: Callable[[], int], timeout: float | None, alone: bool = False) -> bool:
        """``lane``'s owner waits until ``ready()`` (its answers arrived) or ``timeout``, reading the
        socket on its own thread when no one else does: its answer then reaches it with no wake-up
        of another thread in between (docs/latency.md, "Third pass"). From the first call on, the
        reader thread leaves the socket to the owner while only driven lanes are owed; the owner
        dispatches whatever it reads (other lanes' answers, produce answers) as the thread would.
        ``alone``: only if no other owner reads or waits to, and no other lane needs the reader
        thread (``Link.alone``); else it returns False at once, the lane left to the thread."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            link = self._link
            if link is None or link.ended or (alone and not link.alone(lane)):
                self._undriven(link, lane)
                return not alone
            link.driven.add(lane)
            link.drivers += 1
            try:
                while True:
                    if link.thread_reading and not link.needs_thread():
                        # The thread waits in poll for driven lanes alone: it hands over (or, if the
                        # answers are here already, rests: the owner reads from the next one on).
                        link.interrupt()
                    if ready() or link.ended:
                        return True
                    if not link.reading:
                        link.take()
                        break
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return True
                    self._turn.wait(left)
            finally:
                link.drivers -= 1
        sock = link.sock
        assert sock is not None  # the reader thread held the turn until it connected
        error: SluiceError | None = None
        try:
            while not ready():
                left = math.inf if deadline is None else deadline - time.monotonic()
                # One round at least, even at timeout 0: what waits in the socket is read by nobody else.
                if not self._round(link, sock, max(left, 0.0)):
                    error = self._closed_by_broker()
                    break
                if left <= 0:
                    break
        except (SluiceError, OSError, DecodeError) as exc:
            error = connection_failure(self._name, exc)
        finally:
            with self._lock:
                link.release()
                if link.drivers or link.needs_thread() or link.ended or error is not None:
                    self._turn.notify_all()
        if error is not None:
            shutdown(sock)  # the reader thread closes it when it sees the link ended
            self._end(link, error)
        return True

    def nudge(self) -> None:
        """End a driving owner's wait early (another thread has work for it): its ``ready()`` says so
        already; this makes it look. An owner reading is in ``poll``: a byte on the interrupt pipe; one
        waiting for the turn: the condition. The reader thread reading is left alone."""
        with self._lock:
            link = self._link
            if link is not None and not link.ended:
                if link.reading and not link.thread_reading:
                    link.interrupt()
                if link.drivers:
                    self._turn.notify_all()

    def undrive(self, lane: int) -> None:
        """``lane``'s owner no longer reads the socket itself (it waits on more than one connection)."""
        with self._lock:
            self._undriven(self._link, lane)

    def _undriven(self, link: Link | None, lane: int) -> None:
        """Lock held: the reader thread reads ``lane`` again (woken if it rests)."""
        if link is not None and lane in link.driven:
            link.driven.discard(lane)
            self._turn.notify_all()

    def _round(self, link: Link, sock: socket.socket, cap: float) -> bool:
        """Holding the turn: wait up to ``cap`` seconds (or the next deadline) for bytes and
        settle the frames they complete. False: the connection is over."""
        # The socket stays blocking (a timeout on it would also bound the senders' writes);
        # deadlines are kept by polling with a timeout before each receive.
        now = time.monotonic()
        with self._lock:
            if link.next_check <= now and link.overdue(now):
                raise RequestTimedOut(f"{self._name}: no answer within the request's timeout")
            wait = min(link.next_check - now, self._idle_span, cap)
        decrypted = link.decrypted
        if decrypted is None or not decrypted():
            events = link.poller.poll(None if math.isinf(wait) else wait * 1000 + 1)
            if not events:
                return True
            if any(fd == link.interrupt_r for fd, _ in events):
                link.interrupted()
                if len(events) == 1:
                    return True
        n = sock.recv_into(link.chunk)
        if not n:
            return False
        for kind, payload in link.frames.feed(link.view[:n]):
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
                return False  # closed meanwhile: what it owed was failed already
        return True

    def _produced(self, link: Link, response: broker_pb2.ProduceResponse) -> None:
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

    def _fetched(self, link: Link, lane: int, response: broker_pb2.FetchResponse) -> None:
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

    def _end(self, link: Link, error: SluiceError) -> None:
        """The connection is over: every request it owes an answer fails with ``error``."""
        with self._lock:
            owed = list(link.produces)
            for queue in link.lanes.values():
                owed += queue
            if link.ended and not owed:
                return
            link.ended = True
            self._turn.notify_all()  # the resting reader thread ends, waiting owners stop waiting
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
