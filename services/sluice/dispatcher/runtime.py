"""A loaded subscription with its I/O attached: streams, timer, dead-letter queue, feed hooks.

``SubscriptionRuntime`` wraps the pure :class:`~sluice.dispatcher.subscription.Subscription`: every call
into the machine goes through here with the current time, and the returned effects are carried out
by :meth:`SubscriptionRuntime.apply` (hand message batches and active-consumer events to each
consumer's :class:`ConsumerStream`, which the transport adapter encodes; hand dead letters to the
DLQ task, re-arm the one timer, wake the partition feeds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Protocol

from sluice.common.peers import AioPeers
from sluice.dispatcher.budget import MemoryBudget
from sluice.dispatcher.cluster import CoordinatorLink
from sluice.dispatcher.consumer import Consumer
from sluice.dispatcher.dlq import DeadLetterSink, dlq_topic
from sluice.dispatcher.epochs import EpochTrail
from sluice.dispatcher.messages import Message, compact
from sluice.dispatcher.metrics import DispatcherMetrics
from sluice.dispatcher.model import Delivery, Effects, SubscriptionSettings
from sluice.dispatcher.parkstore import ParkStore
from sluice.dispatcher.subscription import Subscription
from sluice.dispatcher.truncation import truncate_partition
from sluice.errors import SluiceError

log = logging.getLogger(__name__)

__all__ = ["ConsumerStream", "Latch", "RuntimeHost", "SubscriptionRuntime"]

#: Seconds between looks for long-held messages pinning large batches (``messages.compact``).
COMPACT_INTERVAL = 5.0
#: Seconds an unload waits for the parking store's queued writes (``ParkStore.close``).
PARK_DRAIN_S = 5.0


class Latch:
    """A flag set once and waited on, as an ``asyncio.Event`` is used here, whose Event (~800 bytes
    with its deque) is made only when someone waits before it is set. A subscription's ``loaded``
    and ``closed`` are almost always set with nobody waiting; with an Event each, they were ~1.6 KB
    of every subscription (``docs/dispatcher.md``, "What a subscription costs")."""

    __slots__ = ("_event", "_set")

    def __init__(self) -> None:
        self._set = False
        self._event: asyncio.Event | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        if self._event is not None:
            # Its waiters hold it until they wake; this object need not.
            self._event.set()
            self._event = None

    async def wait(self) -> None:
        if self._set:
            return
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()


class ConsumerStream:
    """One consumer's stream as the core sees it: what it is attached to, and what it can be told.

    Transport-neutral: the adapter's subclass (``events.EventStream``) encodes each event for its
    transport and writes or queues it. The core never builds a protobuf message."""

    def __init__(self, peer: str = "") -> None:
        self.peer = peer
        self.runtime: SubscriptionRuntime | None = None
        self.consumer: Consumer | None = None
        #: The consumer asked for ``Subscribe.record_batches``: send log batches, not PushedMessages.
        self.record_batches = False
        self.closed = False

    def subscribed(self, consumer_id: str) -> None:
        """The Subscribe succeeded: tell the consumer its id."""
        raise NotImplementedError

    def deliver(self, topic: str, delivery: Delivery) -> int:
        """Send one consumer's messages (one batch); returns the bytes sent."""
        raise NotImplementedError

    def active_change(self, partition: int, active: bool) -> None:
        """Exclusive/Failover: the consumer became (or stopped being) a partition's active one."""
        raise NotImplementedError

    def error(self, err: SluiceError) -> None:
        """Report ``err``; the stream stays open."""
        raise NotImplementedError

    def close(self) -> None:
        """End the stream (idempotent)."""
        raise NotImplementedError

    def fail(self, err: SluiceError) -> None:
        """Send the error, then end the stream."""
        self.error(err)
        self.close()


class RuntimeHost(Protocol):
    """What a loaded subscription needs of the service that owns it (``DispatcherService`` is one).
    A protocol, so that the runtime does not import the service that imports it."""

    @property
    def metrics(self) -> DispatcherMetrics: ...

    @property
    def dlq(self) -> DeadLetterSink: ...

    @property
    def budget(self) -> MemoryBudget: ...

    @property
    def link(self) -> CoordinatorLink: ...

    @property
    def channels(self) -> AioPeers: ...

    def now_ms(self) -> int: ...

    def flush_soon(self) -> None: ...

    def kick_feeds(self, rt: SubscriptionRuntime) -> None: ...


class SubscriptionRuntime:
    """One loaded (topic, subscription). Caller: ``DispatcherService`` and the partition feeds."""

    def __init__(self, service: RuntimeHost, topic: str, name: str, settings: SubscriptionSettings) -> None:
        self.service = service
        self._resume_soon: asyncio.Handle | None = None
        self.machine = Subscription(topic, name, settings, service.budget.account(self._memory_freed))
        self.topic = topic
        self.name = name
        #: The topic incarnation this subscription serves (Metadata's topic_id when it was loaded). Its
        #: cursors are saved with it, so the offset store refuses them once the topic is re-created.
        self.topic_id = ""
        self.streams: dict[str, ConsumerStream] = {}
        self.loaded = Latch()
        self.load_error: SluiceError | None = None
        self.closing = False
        self.closed = Latch()
        self.linger: asyncio.TimerHandle | None = None
        #: Wall-clock ms when its last consumer left (0 while it has consumers, or had none yet).
        self.last_active_ms = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_due: int | None = None
        self._dead: list[tuple[Message, int]] = []
        self._compactor: asyncio.TimerHandle | None = None
        self._dlq_task: asyncio.Task[None] | None = None
        #: Key_Shared parking's store (``parkstore.py``): what parks is written there before the cursor
        #: acknowledges it.
        self.parks = ParkStore(
            topic, name, service.link, service.channels, self._parks_saved, durable=settings.durable
        )
        metrics = service.metrics
        self._m_messages = metrics.dispatched_messages.labels(topic, name)
        self._m_bytes = metrics.dispatched_bytes.labels(topic, name)
        self._m_redeliveries = metrics.redeliveries.labels(topic, name)
        self._m_dlq = metrics.dlq.labels(topic, name)
        self.m_acks = metrics.acks.labels(topic, name)
        self.m_epoch_refused = {k: metrics.epoch_refused.labels(topic, name, k) for k in ("ack", "nack")}

    @property
    def durable(self) -> bool:
        return self.machine.settings.durable

    # ---- the feed's view (FeedTarget) -----------------------------------------------------------------

    def read_position(self, partition: int) -> int | None:
        return self.machine.read_position(partition)

    def wants(self, partition: int) -> bool:
        return not self.closing and self.machine.wants(partition) and self.machine.memory.may_read()

    def within_budget(self) -> bool:
        """Whether records may be offered at all: over its memory budget (``budget.py``) the feed leaves
        it behind, and reads again from its position once memory is freed."""
        return not self.closing and self.machine.memory.may_read()

    def _memory_freed(self) -> None:
        """Its budget account may read again (called inside an ack or a release): kick its feeds soon,
        outside the state machine's call."""
        if self._resume_soon is None and not self.closing:
            self._resume_soon = asyncio.get_running_loop().call_soon(self._resume)

    def _resume(self) -> None:
        self._resume_soon = None
        if not self.closing:
            self.service.kick_feeds(self)

    def offer(self, partition: int, messages: list[Message], start: int, next_offset: int) -> None:
        self.apply(self.machine.offer(partition, messages, next_offset, self.service.now_ms()))

    def skip_to(self, partition: int, position: int) -> None:
        self.apply(self.machine.skip_to(partition, position, self.service.now_ms()))

    def follow_epochs(self, partition: int, trail: EpochTrail) -> None:
        ps = self.machine.partitions.get(partition)
        if ps is not None:
            ps.cursor.epochs = trail

    def truncated(self, partition: int, end: int) -> None:
        """The feed found the log truncated at ``end`` (``truncation.py``), then dispatch what may go
        (a consumer blocked at max_unacked by dropped in-flight messages may take more; due timers fire as
        they would have)."""
        position = self.machine.read_position(partition)
        if position is None:
            return
        dropped, forgotten = truncate_partition(self.machine, partition, end)
        if position > end or dropped or forgotten:
            self.count_truncation(partition, position, end, "feed", dropped, forgotten)
        self.call(self.machine.tick)

    def count_truncation(
        self, partition: int, position: int, end: int, found_by: str, dropped: int = 0, forgotten: int = 0
    ) -> None:
        """Log and count a position moved back by a truncation: never silent."""
        log.warning(
            "%s/%s partition %d: the log was truncated at %d under position %d (found by: %s): %d "
            "read messages dropped, %d acknowledged offsets forgotten; reading the new leader's records "
            "from %d",
            self.topic,
            self.name,
            partition,
            end,
            position,
            found_by,
            dropped,
            forgotten,
            end,
        )
        self.service.metrics.log_truncations.labels(self.topic, self.name, found_by).inc()

    # ---- effects -------------------------------------------------------------------------------------

    def apply(self, fx: Effects) -> None:
        """Carry out what the state machine decided."""
        if fx.deliveries:
            topic = self.topic
            sent = sent_bytes = 0
            for cid, d in fx.deliveries.items():
                stream = self.streams.get(cid)
                if stream is None:
                    continue
                sent_bytes += stream.deliver(topic, d)
                sent += len(d.messages)
            self._m_messages.inc(sent)
            self._m_bytes.inc(sent_bytes)
        for cid, partition, active in fx.active_changes:
            stream = self.streams.get(cid)
            if stream is not None:
                stream.active_change(partition, active)
        if fx.redelivered:
            self._m_redeliveries.inc(fx.redelivered)
        if fx.dead_letters:
            self._dead += fx.dead_letters
            if self._dlq_task is None or self._dlq_task.done():
                self._dlq_task = asyncio.create_task(
                    self._publish_dead(), name=f"dlq-{self.topic}-{self.name}"
                )
        if fx.park_events:
            self.parks.write(fx.park_events)
        if fx.persist_soon:
            self.service.flush_soon()
        self._arm_timer()
        if fx.deliveries:
            self.service.kick_feeds(self)
            if self._compactor is None:
                self._compactor = asyncio.get_running_loop().call_later(COMPACT_INTERVAL, self._compact)

    def call(self, fn: Callable[[int], Effects]) -> None:
        self.apply(fn(self.service.now_ms()))

    # ---- timer ---------------------------------------------------------------------------------------

    def _arm_timer(self) -> None:
        due = self.machine.next_deadline()
        if due is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = self._timer_due = None
            return
        if self._timer is not None and self._timer_due is not None and self._timer_due <= due:
            return
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer_due = due
        # +1 ms: loop.time() rounding must not fire the timer just before the deadline.
        self._timer = loop.call_at((due + 1) / 1000, self._fire)

    def _fire(self) -> None:
        self._timer = self._timer_due = None
        if not self.closing:
            self.apply(self.machine.tick(self.service.now_ms()))

    def _compact(self) -> None:
        """Every COMPACT_INTERVAL while messages are held: free large batches that only a few held
        messages keep alive, and the tables of in-flight dicts a burst left empty. Re-armed by the
        next delivery once nothing is held."""
        self._compactor = None
        if self.closing:
            return
        self.machine.give_back_memory()
        held = list(self.machine.held_messages())
        if not held:
            return
        released = compact(held)
        if released:
            log.debug("%s/%s: compacted held messages, %d bytes released", self.topic, self.name, released)
        self._compactor = asyncio.get_running_loop().call_later(COMPACT_INTERVAL, self._compact)

    # ---- dead letters --------------------------------------------------------------------------------

    async def _publish_dead(self) -> None:
        delay = 0.2
        while self._dead and not self.closing:
            batch, self._dead = self._dead, []
            # Parked messages among them: the store's DLQ mark first (``ParkStore.guard_dead_letters``).
            parked = self.machine.parking.dlq_pos
            stored = sum((m.partition, m.offset) in parked for m, _ in batch) if parked else 0
            try:
                if stored:
                    await self.parks.guard_dead_letters(
                        dlq_topic(self.topic, self.name), stored == len(parked)
                    )
                end = await self.service.dlq.publish(self.topic, self.name, [m for m, _ in batch])
            except (SluiceError, OSError) as exc:
                log.warning(
                    "dead-lettering %d messages of %s/%s failed: %s", len(batch), self.topic, self.name, exc
                )
                self._dead = batch + self._dead
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.2
            self.parks.dead_letters_written(end, stored)
            self._m_dlq.inc(len(batch))
            by_partition: dict[int, list[int]] = defaultdict(list)
            for m, _ in batch:
                by_partition[m.partition].append(m.offset)
            for p, offsets in by_partition.items():
                self.apply(self.machine.dead_lettered(p, offsets, self.service.now_ms()))

    async def restore_parking(self, limit: int) -> None:
        """Loading (before the feeds read): the parked keys from the store (``parkstore.py``)."""
        await self.parks.load(self.machine, dlq_topic(self.topic, self.name), limit, self.service.now_ms())

    def _parks_saved(self, saved: dict[int, list[int]]) -> None:
        # The cursor only, no dispatch pass: acknowledging a stored message frees no consumer's capacity,
        # and a pass per park write (one per store round trip while a key parks) cut the other keys'
        # deliveries into more, smaller ones (docs/poison-keys.md, "Measured"). The next pass, flush
        # and ``resolve`` see it.
        self.machine.parking.saved(self.machine, saved)

    # ---- shutdown ------------------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop timers and background work (the service flushes cursors and detaches feeds)."""
        self.closing = True
        if self._resume_soon is not None:
            self._resume_soon.cancel()
            self._resume_soon = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        if self._compactor is not None:
            self._compactor.cancel()
            self._compactor = None
        if self._dlq_task is not None:
            self._dlq_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._dlq_task
        await self.parks.close(PARK_DRAIN_S)
        self.machine.close()
