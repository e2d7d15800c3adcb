"""One connection of a ``SharedConnection`` (``client.shared_wire``): its socket, what it owes, who reads it.

Kept apart from the connection's threads and frames because it is the state both kinds of reader
share: the connection's reader thread, and a fetcher's caller that reads the socket itself while it
waits for its own answers (``SharedConnection.drive``; docs/latency.md, "Third pass"). Exactly one of
them holds the *turn* (``reading``) at a time, and the frame reader and receive buffer live here so a
frame split over two reads is finished by whoever reads next.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.common.wire import FrameReader

__all__ = ["Link", "Waiting"]

_RECV_BYTES = 1 << 20


@dataclass(slots=True)
class Waiting:
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


class Link:
    """One TCP connection and the requests it still owes answers to. Guarded by the connection's lock."""

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        #: Frames sent before the hello was answered; None once they went out.
        self.pending: list[bytes] | None = []
        self.produces: collections.deque[Waiting] = collections.deque()
        #: Per lane with something waiting: its requests, oldest first.
        self.lanes: dict[int, collections.deque[Waiting]] = {}
        #: No deadline is due before this (senders lower it; the reader's scan sets it).
        self.next_check = math.inf
        self.ended = False
        #: TLS: a send writes one joined buffer (one TLS record, not one per frame part).
        self.join = False
        #: Someone holds the turn to read the socket: the reader thread from the start (it connects),
        #: or a driving owner (``SharedConnection.drive``).
        self.reading = True
        #: Lanes whose owner reads the socket itself when it waits: the reader thread leaves their
        #: answers in the socket while nothing else is owed (the owner takes them, no hand-off).
        self.driven: set[int] = set()
        #: Owners waiting for the turn (the reader thread hands it over when it ends a round).
        self.drivers = 0
        #: The turn is the reader thread's (an owner waiting for it interrupts its ``poll``).
        self.thread_reading = True
        #: When the turn was last released (monotonic): the time nobody read, which is not the
        #: broker's silence, does not count toward a driven lane's deadline (``take``).
        self.released_at = 0.0
        self.frames = FrameReader()
        self.chunk = bytearray(_RECV_BYTES)
        self.view = memoryview(self.chunk)
        self.poller = select.poll()
        #: TLS: bytes already decrypted inside the SSL object do not make the socket readable.
        self.decrypted: Callable[[], int] | None = None
        #: A byte here ends a driving owner's wait in ``poll`` (its lane was closed from another
        #: thread: the answer it waits for is the failure ``cancel`` queued, not the broker's).
        self.interrupt_r, self.interrupt_w = os.pipe()
        os.set_blocking(self.interrupt_r, False)
        os.set_blocking(self.interrupt_w, False)
        self.poller.register(self.interrupt_r, select.POLLIN)

    def readable(self, sock: socket.socket) -> None:
        """The greeted socket: from now on it is polled for answers."""
        self.poller.register(sock, select.POLLIN)
        self.decrypted = getattr(sock, "pending", None)

    def take(self) -> None:
        """Take the turn. A driven lane's followed request gets the time nobody read back on its
        deadline: its owner away longer than the deadline, with answers waiting in the socket, is not
        a silent broker (and a broker silent while someone read is caught by that reader)."""
        self.reading = True
        gap = time.monotonic() - self.released_at
        for lane in self.driven:
            for w in self.lanes.get(lane, ()):
                if w.span and w.deadline != math.inf:
                    w.deadline += gap

    def release(self) -> None:
        self.reading = False
        self.released_at = time.monotonic()

    def interrupt(self) -> None:
        if self.interrupt_w >= 0:  # not closed (a number closed may be reused by another file)
            with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
                os.write(self.interrupt_w, b"\0")

    def interrupted(self) -> None:
        """Drain the interrupts (whoever reads next has its ``ready()`` to check)."""
        with contextlib.suppress(OSError):
            os.read(self.interrupt_r, 4096)

    def close_interrupts(self) -> None:
        """The link is over (the connection's lock held: ``interrupt`` is called under it)."""
        if self.interrupt_w >= 0:
            os.close(self.interrupt_r)
            os.close(self.interrupt_w)
            self.interrupt_r = self.interrupt_w = -1

    def overdue(self, now: float) -> bool:
        """Whether a request is past its deadline; else note the next one (``next_check``)."""
        # Every request of a lane (one or two: a followed fetch and the one replacing it), and
        # the oldest produce: produces are answered in order, so a later one cannot come first.
        due = min((w.deadline for queue in self.lanes.values() for w in queue), default=math.inf)
        if self.produces:
            due = min(due, self.produces[0].deadline)
        self.next_check = due
        return due <= now

    def alone(self, lane: int) -> bool:
        """``lane``'s owner may drive without becoming everyone's reader: no other owner reads or waits
        to read, and no other lane is owed that only the reader thread would read (owners of many
        lanes on one connection each waiting for the turn would all be woken at every round; the
        group consumer's ``poll()`` then leaves its lane to the thread, docs/latency.md, "Fourth pass").
        Produce answers do not count: a driving owner reads them, or the thread does while they are owed."""
        if self.drivers or (self.reading and not self.thread_reading):
            return False
        driven = self.driven
        return not any(other != lane and other not in driven for other, queue in self.lanes.items() if queue)

    def needs_thread(self) -> bool:
        """Something is owed that no driving owner would read: the reader thread must read."""
        if self.produces:
            return True
        driven = self.driven
        return any(lane not in driven for lane, queue in self.lanes.items() if queue)

    def thread_may_rest(self) -> bool:
        """The reader thread leaves the socket alone: someone else reads it, or only driven lanes
        are owed. Without driven lanes it stays in ``poll`` (a producer's answers each wake it once,
        not twice: a rest would need a wake-up per request to read again)."""
        return self.reading or (bool(self.driven) and not self.needs_thread())
