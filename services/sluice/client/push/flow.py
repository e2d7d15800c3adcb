"""Flow control of a push consumer as explicit counters: a pure state machine.

No I/O, no clock and no locks: the consumer calls these methods under its own lock
and sends the ``(stream, permits)`` grants they return as ``Flow`` commands.

Per stream (one per dispatcher that serves some of the topic's partitions):

* ``share``: the permits the stream is entitled to: ``receiver_queue_size`` split
  across the streams, at least 1 each (the redrive topic's streams split a tenth of it:
  ``set_streams``'s ``minor``);
* ``outstanding``: granted with ``Flow`` and not delivered yet;
* ``queued``: delivered and waiting in the receiver queue;
* ``taken``: taken by the application since the last refill. Once it reaches
  ``threshold`` (half the share, at least 1) it is granted again, Pulsar's
  ``availablePermits >= receiverQueueRefillThreshold``.

While a stream is subscribed and not paused, ``outstanding + queued + taken == share``:
the consumer never holds more than its share, the dispatcher never sends more.

Auto-scaled window (``autoscale``, on when the Client has a ``memory_limit``; Pulsar's PIP-74 with
``autoScaledReceiverQueueSizeEnabled``): each stream may only have ``window`` permits out or
queued (``outstanding + queued <= window <= share``); what its share allows beyond the window stays
in ``taken``, granted as the window grows. The window starts at ``INITIAL_WINDOW``, doubles whenever
the application empties the stream's queue while the Client is below ``near_limit``, and halves on
each delivery while it is above: receiver queues shrink as the Client's memory fills, instead of
each holding its whole share at the limit (docs/memory.md, "SDK").

Zero-queue (``receiver_queue_size == 0``): there is at most ONE outstanding permit
across all streams, granted only while someone waits for a message and nothing is
queued, so the consumer never holds more than one message. The permit goes to the
next subscribed stream in rotation, so every dispatcher (and its partitions) gets its
turn. A permit cannot be taken back on the wire: if its stream has nothing to send,
the consumer moves it by resubscribing that stream (a "handoff", decided by the
consumer) and reports it here with :meth:`FlowControl.on_idle`; the rotation then
skips that stream for 1, 2, 4, ... up to ``MAX_IDLE_SKIPS`` grants, until it delivers
again, so a dry dispatcher costs few handoffs and still gets a turn now and then
(see docs/push-consumer.md, "Zero-queue").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Hashable, Iterable
from dataclasses import dataclass

__all__ = ["FlowControl", "FlowStats", "Grant", "StreamFlow"]

Grant = tuple[Hashable, int]
#: Zero-queue: most grants an idle stream is skipped for before it is tried again.
MAX_IDLE_SKIPS = 64
#: Auto-scaled window: where a stream's window starts (Pulsar starts at 1; a few messages more let
#: the first round trip fill a batch, and the doubling reaches a share of 1,000 in 7 steps).
INITIAL_WINDOW = 8
#: The part of the receiver queue the minor streams (a redrive topic's) share: a tenth.
MINOR_PART = 10


@dataclass(slots=True)
class StreamFlow:
    """The counters of one stream (see the module docstring)."""

    share: int = 0
    threshold: int = 1
    #: Auto-scaled window: permits this stream may have out or queued (== share when not scaled).
    window: int = 0
    #: Zero-queue: grants this stream is still skipped for, and the current skip level.
    idle_skips: int = 0
    idle_level: int = 0
    outstanding: int = 0
    queued: int = 0
    taken: int = 0
    subscribed: bool = False


@dataclass(frozen=True, slots=True)
class FlowStats:
    """A snapshot of the counters, for tests, metrics and ``describe``."""

    queued: int
    outstanding: int
    max_queued: int
    max_outstanding: int
    permits_granted: int
    delivered: int
    taken: int
    #: Messages that arrived beyond the permits (a dispatcher bug; they are still queued).
    over_delivered: int
    #: Messages dropped from the queue because their stream reconnected.
    dropped: int
    paused: bool
    streams: dict[Hashable, StreamFlow]


class FlowControl:
    """Caller: PushConsumer, under its lock. Affects: nothing but these counters."""

    def __init__(
        self, receiver_queue_size: int, streams: Iterable[Hashable] = (), autoscale: bool = False
    ) -> None:
        if receiver_queue_size < 0:
            raise ValueError("receiver_queue_size must be >= 0")
        self.queue_size = receiver_queue_size
        #: receiver_queue_size == 0 (an attribute, not a property: read per message).
        self.zero_queue = receiver_queue_size == 0
        self.paused = False
        #: The Client's memory_limit is reached (``client/memory.py``): grants wait, as paused.
        self.held = False
        #: Auto-scaled windows (the module docstring); ``near_limit``: the Client's memory is close
        #: to its limit (windows halve, never grow). Set by the consumer.
        self.autoscale = autoscale
        self.near_limit = False
        self.streams: dict[Hashable, StreamFlow] = {}
        #: Zero-queue: the stream holding the one outstanding permit, if any.
        self.holder: Hashable | None = None
        self._rotation = 0
        self.max_queued = 0
        self.max_outstanding = 0
        self.permits_granted = 0
        self.delivered = 0
        self.taken_total = 0
        self.over_delivered = 0
        self.dropped = 0
        self.set_streams(streams)

    # ---- topology ----------------------------------------------------------------

    def set_streams(self, keys: Iterable[Hashable], minor: Collection[Hashable] = ()) -> None:
        """A new set of streams (first routing, or routing changed): all start unsubscribed.

        ``minor`` streams (the consumer's redrive topic, docs/retry.md) split ``1 / MINOR_PART`` of
        the queue among them and the others the rest, so a mostly idle redrive stream costs the
        topic's streams a tenth of their prefetch, not half of it. At least 1 each."""
        keys = list(keys)
        main = [k for k in keys if k not in minor]
        small = [k for k in keys if k in minor]
        minor_total = self.queue_size // MINOR_PART if main else self.queue_size
        shares = _split(self.queue_size - minor_total if small else self.queue_size, main)
        shares.update(_split(minor_total, small))
        self.streams = {}
        self.holder = None
        for key in keys:
            share = 0 if self.zero_queue else shares[key]
            window = min(share, INITIAL_WINDOW) if self.autoscale else share
            self.streams[key] = StreamFlow(share=share, threshold=max(1, share // 2), window=window)

    # ---- stream events -------------------------------------------------------------

    def on_subscribed(self, key: Hashable) -> list[Grant]:
        """The stream is (re)subscribed: it starts from zero and gets its share."""
        s = self.streams[key]
        s.subscribed = True
        s.outstanding = s.queued = s.taken = 0
        if self.zero_queue:
            return []
        s.taken = s.share  # granted now, or on resume() / unhold(), within the window
        if self.paused or self.held:
            return []
        return self._grant_owed(key, s)

    def on_disconnected(self, key: Hashable) -> int:
        """The stream broke. Its queued messages are dropped by the caller (the dispatcher
        redelivers them, they were never acked); returns how many."""
        s = self.streams.get(key)
        if s is None:
            return 0
        dropped = s.queued
        self.dropped += dropped
        s.subscribed = False
        s.outstanding = s.queued = s.taken = 0  # idle_* survive: a handoff is a disconnect
        if self.holder == key:
            self.holder = None
        return dropped

    def on_delivered(self, key: Hashable, n: int) -> None:
        """``n`` messages arrived on the stream and were queued."""
        s = self.streams[key]
        if n > s.outstanding:
            self.over_delivered += n - s.outstanding
            s.outstanding = 0
        else:
            s.outstanding -= n
        s.queued += n
        s.idle_skips = s.idle_level = 0
        if self.autoscale and self.near_limit:
            s.window = max(1, s.window // 2)  # the Client's memory fills: this queue shrinks
        self.delivered += n
        if self.zero_queue and self.holder == key and s.outstanding == 0:
            self.holder = None
        self._watermarks()

    def on_taken(self, key: Hashable, n: int = 1) -> list[Grant]:
        """The application took ``n`` messages of the stream from the queue (``receive_many`` takes
        a batch: one call, at most one grant, whatever its size)."""
        s = self.streams[key]
        s.queued -= n
        self.taken_total += n
        if self.zero_queue:
            return []
        s.taken += n
        if self.autoscale and s.queued == 0 and not self.near_limit:
            s.window = min(s.share, 2 * s.window)  # the application keeps up: a larger window
        if s.subscribed and not self.paused and not self.held:
            return self._grant_owed(key, s, self._threshold(s))
        return []

    def on_untaken(self, key: Hashable, n: int) -> None:
        """``n`` taken messages went back to the front of the queue (an iterator left before yielding
        them). ``taken`` may go below 0 when their permits were granted already: that debt is paid by
        the next takes, so ``outstanding + queued + taken == share`` holds throughout."""
        s = self.streams[key]
        s.queued += n
        self.taken_total -= n
        if not self.zero_queue:
            s.taken -= n
        self._watermarks()

    def want_one(self, waiting: bool) -> list[Grant]:
        """Zero-queue: someone waits for a message. Grants one permit to the next subscribed
        stream when no permit is outstanding and nothing is queued."""
        if not (self.zero_queue and waiting) or self.paused or self.holder is not None:
            return []
        if any(s.queued for s in self.streams.values()):
            return []
        keys = list(self.streams)
        fallback = None
        for i in range(len(keys)):
            idx = (self._rotation + i) % len(keys)
            s = self.streams[keys[idx]]
            if not s.subscribed:
                continue
            if s.idle_skips:
                s.idle_skips -= 1
                fallback = idx if fallback is None else fallback
                continue
            return self._grant_one(keys, idx)
        # Every subscribed stream was recently idle: the first of them gets it anyway.
        return [] if fallback is None else self._grant_one(keys, fallback)

    def on_idle(self, key: Hashable) -> None:
        """Zero-queue: the permit was moved off this stream because it had nothing to send."""
        s = self.streams.get(key)
        if s is not None:
            s.idle_level = min(max(s.idle_level * 2, 1), MAX_IDLE_SKIPS)
            s.idle_skips = s.idle_level

    def _grant_one(self, keys: list[Hashable], idx: int) -> list[Grant]:
        self._rotation = idx + 1
        self.holder = keys[idx]
        return [self._grant(keys[idx], self.streams[keys[idx]], 1)]

    # ---- application -------------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True

    def resume(self, waiting: bool) -> list[Grant]:
        """Grant what was held back while paused."""
        self.paused = False
        if self.zero_queue:
            return self.want_one(waiting)
        return self._regrant()

    def unhold(self) -> list[Grant]:
        """The memory limit has room again: grant what was held back (unless paused)."""
        self.held = False
        return [] if self.paused or self.zero_queue else self._regrant()

    def _regrant(self) -> list[Grant]:
        if self.held:
            return []
        grants = []
        for key, s in self.streams.items():
            if s.subscribed:
                grants += self._grant_owed(key, s, self._threshold(s))
        return grants

    # ---- reading ----------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return sum(s.queued for s in self.streams.values())

    @property
    def outstanding(self) -> int:
        return sum(s.outstanding for s in self.streams.values())

    def stats(self) -> FlowStats:
        return FlowStats(
            queued=self.queued,
            outstanding=self.outstanding,
            max_queued=self.max_queued,
            max_outstanding=self.max_outstanding,
            permits_granted=self.permits_granted,
            delivered=self.delivered,
            taken=self.taken_total,
            over_delivered=self.over_delivered,
            dropped=self.dropped,
            paused=self.paused,
            streams={k: dataclasses.replace(s) for k, s in self.streams.items()},
        )

    # ---- internals ----------------------------------------------------------------------

    @staticmethod
    def _threshold(s: StreamFlow) -> int:
        """Permits worth one Flow: half the share, or of a smaller window (Pulsar's refill threshold)."""
        return min(s.threshold, max(1, s.window // 2))

    def _grant_owed(self, key: Hashable, s: StreamFlow, at_least: int = 1) -> list[Grant]:
        """Grant what the stream is owed (``taken``) as far as its window allows, if that is at least
        ``at_least`` (one Flow per refill threshold, not one per message)."""
        n = min(s.taken, s.window - s.outstanding - s.queued)
        if n < at_least:
            return []
        s.taken -= n
        return [self._grant(key, s, n)]

    def _grant(self, key: Hashable, s: StreamFlow, n: int) -> Grant:
        s.outstanding += n
        self.permits_granted += n
        self._watermarks()
        return (key, n)

    def _watermarks(self) -> None:
        q, o = self.queued, self.outstanding
        self.max_queued = max(self.max_queued, q)
        self.max_outstanding = max(self.max_outstanding, o)


def _split(total: int, keys: list[Hashable]) -> dict[Hashable, int]:
    """``total`` permits split evenly across ``keys`` (the first ones get the remainder), at least 1 each."""
    n = len(keys)
    return {k: max(1, total // n + (1 if i < total % n else 0)) for i, k in enumerate(keys)}
