"""A producer's and a fetcher's views of a ``SharedConnection`` (``client.shared_wire``).

Links with the ``send``/``close`` contract of ``client.streams.RequestStream``; a fetcher's lane can
also follow (a continuous fetch) and drive (read the connection on the caller's thread while it waits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sluice.client.streams import Callback
from sluice.common.wire import WireRequest

__all__ = ["Connection", "FetchLane", "ProduceLink"]


class Connection(Protocol):
    """What the views use of ``client.shared_wire.SharedConnection`` (which makes them)."""

    def submit(
        self,
        owner: object,
        request: WireRequest,
        timeout: float,
        on_done: Callable[[Any], bool | None],
        lane: int = 0,
        window: int = 0,
    ) -> None: ...

    def grant(self, lane: int, n: int) -> None: ...

    def cancel(self, owner: object, lane: int = 0) -> None: ...

    def drive(
        self, lane: int, ready: Callable[[], int], timeout: float | None, alone: bool = False
    ) -> bool: ...

    def nudge(self) -> None: ...

    def undrive(self, lane: int) -> None: ...


class ProduceLink:
    """A producer's view of the shared connection (``BrokerLink``)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def send(self, request: Any, timeout: float, on_done: Callback) -> None:
        self._conn.submit(self, request, timeout, on_done)

    def close(self) -> None:
        """Fail this producer's requests still waiting; the connection goes on for the others."""
        self._conn.cancel(self)


class FetchLane:
    """A fetcher's lane on the shared connection (``BrokerLink``, and it can follow)."""

    __slots__ = ("_conn", "_every", "_owed", "driven", "lane", "sent")

    def __init__(self, conn: Connection, lane: int) -> None:
        self._conn = conn
        self.lane = lane
        #: Fetch requests sent on the lane (a followed one counts once, however often answered).
        self.sent = 0
        self._owed = 0  # answers taken, not granted back yet
        self._every = 1  # how many make one LANE_CREDIT frame
        self.driven = False  # the owner reads the connection itself when it waits (``drive``)

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

    def drive(self, ready: Callable[[], int], timeout: float | None, alone: bool = False) -> bool:
        """Wait for this lane's answers (until ``ready()`` or ``timeout``) reading the connection on
        the caller's thread (``SharedConnection.drive``). ``alone``: only if no other owner reads or
        waits to and no other lane needs the reader thread; False (nothing waited) otherwise."""
        self.driven = self._conn.drive(self.lane, ready, timeout, alone)
        return self.driven

    def nudge(self) -> None:
        """Another thread has work for the owner: end its wait in ``drive`` (its ``ready()`` says so)."""
        self._conn.nudge()

    def undrive(self) -> None:
        """The owner waits on several connections: the reader thread reads this lane's answers."""
        if self.driven:
            self.driven = False
            self._conn.undrive(self.lane)

    def close(self) -> None:
        """End the lane: its waiting requests fail (BrokerNotAvailable), the broker stops it."""
        self._conn.cancel(self, self.lane)
