"""PushConsumer: the application's side of a push subscription.

::

    pc = client.push_consumer("orders", subscription="s", type="shared", receiver_queue_size=0)
    msg = pc.receive(timeout=5.0)
    pc.ack(msg)                      # or pc.nack(msg), pc.ack_cumulative(msg)
    msg = await pc.receive_async()   # from asyncio code
    pc.close()

The parts: :mod:`~sluice.client.push.stream` keeps one Consume stream per dispatcher
that serves some of the topic's partitions (the coordinator's routing), and
:mod:`~sluice.client.push.flow` decides every permit. This module merges the streams
into one receiver queue, hands messages to ``receive()`` / ``receive_async()`` / the
listener thread, and routes each ack back to the session that delivered the message.

The streams, the routing and the callbacks the stream threads call live in
:mod:`~sluice.client.push.sessions` (``PushSessions``, which this class extends).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat, starmap
from operator import attrgetter
from types import TracebackType
from typing import Any

from sluice.client.memory import ClientMemory
from sluice.client.metadata import MetadataCache
from sluice.client.push.config import PushConsumerConfig
from sluice.client.push.message import Message
from sluice.client.push.nacks import backoff_hold
from sluice.client.push.outbound import AckKey, Outbound
from sluice.client.push.sessions import PushSessions
from sluice.client.push.stats import PushConsumerStats, StreamInfo
from sluice.client.push.stream import Session, StreamState
from sluice.client.push.unacked import AckCounter, add_ids, discard_ids, pop_ids
from sluice.common.peers import Peers
from sluice.errors import InvalidArgument, RequestTimedOut, SluiceError

__all__ = ["PushConsumer", "PushConsumerStats", "StreamInfo", "StreamState", "make_config"]

log = logging.getLogger(__name__)

#: How long close() lets pending acks reach the dispatcher before cutting the streams.
CLOSE_GRACE = 2.0
#: How long ``receive_many`` lets the stream's writer take the permits it just granted before the
#: application computes on the batch (``Outbound.wait_flow_written``).
FLOW_HANDOFF_S = 0.002
_DEFAULT_NACK_DELAY = 1.0  # the dispatcher's default, used for the client-side backoff
#: How many queued messages the iterator and the listener take at a time (one lock, one flow
#: update): what is not yet yielded when an iterator is left goes back to the queue's front.
TAKE_BATCH = 128

_session_of_msg = attrgetter("_session")
_partition_of = attrgetter("partition")
_offset_of = attrgetter("offset")
_epoch_of = attrgetter("leader_epoch")


class PushConsumer(PushSessions):
    """Made by :meth:`sluice.Client.push_consumer`; see the module docstring. Thread-safe."""

    def __init__(
        self,
        topic: str,
        subscription: str,
        type_: str,
        config: PushConsumerConfig,
        channels: Peers,
        metadata: MetadataCache,
        client_id: str,
        on_close: Callable[[PushConsumer], None] | None = None,
        memory: ClientMemory | None = None,
    ) -> None:
        self._on_close = on_close
        #: Permits the last batch take granted, as (outbound, grant number): ``receive_many``.
        self._granted: list[tuple[Outbound, int]] = []
        #: Acks by ``ack()``, counted without the lock (``unacked.py``); the others count in ``_acked``.
        self._single_acks = AckCounter()
        super().__init__(topic, subscription, type_, config, channels, metadata, client_id, memory)
        if config.message_listener is not None:
            self._listener_thread = threading.Thread(
                target=self._listen, daemon=True, name=f"sluice-push-listener-{subscription}"
            )
            self._listener_thread.start()

    # ---- receiving ----------------------------------------------------------------------------

    def receive(self, timeout: float | None = None) -> Message:
        """The next message; waits up to ``timeout`` seconds (None: forever). Raises RequestTimedOut
        (a TimeoutError) when none came, the typed error when the subscription failed (e.g.
        CONSUMER_BUSY after a reconnect), SluiceError when closed."""
        if self._listener is not None:
            raise InvalidArgument("this consumer has a message_listener: messages go to it, not to receive()")
        with self._lock:  # fast path: a message is waiting
            if self._queue and self._fatal is None and not self._closed:
                return self._take_locked()
        msg = self._take(timeout)
        if msg is None:
            raise RequestTimedOut(f"no message within {timeout:g} s")
        return msg

    def receive_many(self, max_messages: int = 1000, timeout: float | None = None) -> list[Message]:
        """What is queued, up to ``max_messages``, once at least one message is; waits up to
        ``timeout`` seconds for the first (None: forever; 0: no wait). An empty list when none came.

        The batch is taken under one lock with one flow update per stream, so its cost per message
        is a fraction of ``receive()``'s. Each message is acked (``ack`` / ``ack_many``) or nacked
        as usual. Raises like ``receive()``, except that a timeout returns ``[]``.
        """
        if self._listener is not None:
            raise InvalidArgument("this consumer has a message_listener: messages go to it, not to receive()")
        if max_messages < 1:
            raise InvalidArgument(f"max_messages must be >= 1, got {max_messages}")
        msgs = self._take_batch(timeout, max_messages)[0]
        granted, self._granted = self._granted, []
        for outbound, seq in granted:
            outbound.wait_flow_written(seq, FLOW_HANDOFF_S)
        return msgs

    async def receive_async(self, timeout: float | None = None) -> Message:  # noqa: ASYNC109
        """``await pc.receive_async()``: receive() for asyncio code, without blocking the loop."""
        msgs = await self._receive_async(timeout, 1)
        if not msgs:
            raise RequestTimedOut(f"no message within {timeout:g} s")
        return msgs[0]

    async def receive_many_async(
        self,
        max_messages: int = 1000,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> list[Message]:
        """``await pc.receive_many_async()``: receive_many() for asyncio code."""
        if max_messages < 1:
            raise InvalidArgument(f"max_messages must be >= 1, got {max_messages}")
        return await self._receive_async(timeout, max_messages)

    async def _receive_async(self, timeout: float | None, limit: int) -> list[Message]:  # noqa: ASYNC109
        if self.config.message_listener is not None:
            raise InvalidArgument("this consumer has a message_listener: messages go to it, not to receive()")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                self._check_usable()
                if self._queue:
                    return self._take_many_locked(limit)[0]
                fut: asyncio.Future[None] = loop.create_future()
                waiter = (loop, fut)
                self._async_waiters.append(waiter)
                self._waiting += 1
                self._send(self._flow.want_one(True))
            try:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return []
                with self._lock:
                    handoff = self._handoff_wait()
                await asyncio.wait({fut}, timeout=_earliest(remaining, handoff))
            finally:
                with self._lock:
                    self._waiting -= 1
                    if waiter in self._async_waiters:
                        self._async_waiters.remove(waiter)

    def __iter__(self) -> Iterator[Message]:
        """``for msg in push_consumer``: messages as they arrive, until the consumer is closed (by
        ``close()`` from another thread, or ``break`` then ``close()``). Ack each one as usual.

        Raises the subscription's typed error if it fails; InvalidArgument with a message_listener.
        """
        if self._listener is not None:
            raise InvalidArgument("this consumer has a message_listener: messages go to it, not to a loop")
        while True:
            msgs, nbytes = self._take_batch(None, TAKE_BATCH, stop_when_closed=True)
            if not msgs:
                if self._fatal is not None and not self._closed:
                    raise self._fatal
                return
            given = 0
            try:
                for msg in msgs:
                    yield msg
                    given += 1
            finally:
                if given < len(msgs):  # left early (break, an exception): the rest is not the caller's
                    self.give_back(msgs[given:], nbytes * (len(msgs) - given) // len(msgs))

    def _take(self, timeout: float | None, stop_when_closed: bool = False) -> Message | None:
        msgs = self._take_batch(timeout, 1, stop_when_closed)[0]
        return msgs[0] if msgs else None

    def _take_batch(
        self, timeout: float | None, limit: int, stop_when_closed: bool = False
    ) -> tuple[list[Message], int]:
        """Up to ``limit`` messages once one is queued (``[]`` at the timeout, or once closed with
        ``stop_when_closed``), and the queue bytes they released."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._waiting += 1
            try:
                while True:
                    if stop_when_closed and (self._closed or self._fatal is not None):
                        return [], 0
                    self._check_usable()
                    if self._queue:
                        return self._take_many_locked(limit)
                    self._send(self._flow.want_one(True))
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return [], 0
                    self._cond.wait(_earliest(remaining, self._handoff_wait()))
            finally:
                self._waiting -= 1

    def _take_locked(self) -> Message:
        msg = self._queue.popleft()
        self._dequeued(len(self._queue), len(self._queue) + 1)
        session: Session = msg._session  # type: ignore[assignment]
        session.unacked[msg.partition, msg.offset, msg.leader_epoch] = True
        if self._flow.held:  # the Client's memory limit: grant again only once it has room
            self._flow.held = self._memory.full(self, self._memory_room)
        grants = self._flow.on_taken(session.stream.key)
        if self._flow.zero_queue and self._waiting > 1:
            grants += self._flow.want_one(True)  # another receiver is still waiting
        if grants:
            self._send(grants)
        return msg

    def _take_many_locked(self, limit: int) -> tuple[list[Message], int]:
        """``_take_locked`` for up to ``limit`` queued messages: C-level bookkeeping per session (one
        unacked update, one flow update), not a Python step per message. Returns the messages and
        the queue bytes they released. Under the lock, with the queue not empty."""
        queue = self._queue
        before = len(queue)
        msgs = list(starmap(queue.popleft, repeat((), min(limit, before))))  # the pops at C level
        nbytes = self._dequeued(len(queue), before)
        sessions: set[Session] = set(map(_session_of_msg, msgs))
        if self._flow.held:
            self._flow.held = self._memory.full(self, self._memory_room)
        grants = []
        for session in sessions:
            mine = msgs if len(sessions) == 1 else [m for m in msgs if m._session is session]
            add_ids(session.unacked, _ids(mine))
            grants += self._flow.on_taken(session.stream.key, len(mine))
        if self._flow.zero_queue and self._waiting > 1:
            grants += self._flow.want_one(True)
        if grants:
            # The latest batch's grants only (replaced, never grown: the iterator, the listener and
            # asyncio take batches too and do not wait on them); ``receive_many`` waits on them.
            self._granted = self._send(grants)
        return msgs, nbytes

    def give_back(self, msgs: list[Message], nbytes: int | None = None) -> None:
        """Received messages not handed on (an iterator left early) go back to the queue's front, as
        if never received, so the next receive gets them. Those of a session that ended meanwhile
        are dropped (the dispatcher redelivers them). ``nbytes``: the queue bytes they released
        (None: the queue's current average per message), for the Client's memory limit."""
        if not msgs:
            return
        with self._lock:
            if self._closed or self._fatal is not None:
                return
            if nbytes is None:
                nbytes = self._queued_bytes * len(msgs) // len(self._queue) if self._queue else 0
            # Only what this consumer holds unacked: not what was acked, nor another session's.
            back = [m for m in msgs if self._holds(m)]
            for session in set(map(_session_of_msg, back)):
                mine = [m for m in back if m._session is session]
                discard_ids(session.unacked, _ids(mine))
                self._flow.on_untaken(session.stream.key, len(mine))
            self._queue.extendleft(reversed(back))
            self._requeued(nbytes * len(back) // len(msgs))
            if self._waiting:
                self._cond.notify(len(back))
                if self._async_waiters:
                    self._wake_async()

    def _holds(self, msg: Message) -> bool:
        session = msg._session
        return (
            isinstance(session, Session)
            and self._current(session)
            and (msg.partition, msg.offset, msg.leader_epoch) in session.unacked
        )

    def _listen(self) -> None:
        listener = self.config.message_listener
        assert listener is not None
        while True:
            try:
                msgs = self._take_batch(None, TAKE_BATCH, stop_when_closed=True)[0]
            except SluiceError as exc:
                log.error("push consumer %s/%s stopped: %s", self.topic, self.subscription, exc)
                return
            if not msgs:
                return
            for msg in msgs:
                if self._closed:  # the rest of the batch is redelivered once the streams end
                    return
                try:
                    listener(self, msg)
                except Exception:
                    log.exception("message listener failed on %r; nacking it", msg)
                    self.nack(msg)

    # ---- acknowledging ---------------------------------------------------------------------------

    def ack(self, msg: Message) -> None:
        """Acknowledge one message (idempotent). Acks are batched with other pending commands. No
        lock: the id's removal is one atomic C call, so of racing acks one sends it (``unacked.py``)."""
        session = getattr(msg, "_session", None)  # _session_of, inlined: this runs once per message
        if not isinstance(session, Session) or session.stream.owner is not self:
            raise InvalidArgument("this message was not received by this consumer")
        # With its epoch: an old record truncated away and the new one at its offset are two keys.
        key = (msg.partition, msg.offset, msg.leader_epoch)
        if session.unacked.pop(key, None) is None:
            if not session.active:
                with self._lock:
                    self._stale += 1
            return
        self._single_acks.bump()
        session.outbound.ack_id(key)

    def ack_many(self, msgs: Iterable[Message]) -> None:
        """Acknowledge every message of ``msgs`` (idempotent, like ``ack``): one lock and one
        hand-over to the stream's writer per session, C-level set work for the ids. They leave
        as ``[start, end)`` runs per partition, like every ack."""
        msgs = list(msgs)
        if not msgs:
            return
        sessions = set(map(_session_of_msg, msgs))
        for session in sessions:
            if not isinstance(session, Session) or session.stream.owner is not self:
                raise InvalidArgument("a message was not received by this consumer")
        for session in sessions:
            mine = msgs if len(sessions) == 1 else [m for m in msgs if m._session is session]
            keys = list(set(_ids(mine)))
            fresh = pop_ids(session.unacked, keys)
            with self._lock:
                self._acked += len(fresh)
                if not session.active:
                    self._stale += len(keys) - len(fresh)
            if fresh:
                session.outbound.ack_many(fresh)

    def ack_cumulative(self, msg: Message) -> None:
        """Acknowledge ``msg`` and every earlier message of its partition (Exclusive and
        Failover only: with Shared/Key_Shared, earlier messages may belong to other consumers)."""
        if self.type in ("shared", "key_shared"):
            raise InvalidArgument(f"ack_cumulative is not allowed on a {self.type} subscription: use ack()")
        session = self._session_of(msg)
        with self._lock:
            if not session.active:
                self._stale += 1
                return
            e = msg.leader_epoch  # not newer epochs' records: the dispatcher refuses an ack over them
            done = [  # over a copy: ack() removes ids without the lock
                k
                for k in list(session.unacked)
                if k[0] == msg.partition and k[1] <= msg.offset and (e is None or k[2] is None or k[2] <= e)
            ]
            self._acked += len(pop_ids(session.unacked, done))
        session.outbound.ack_cumulative(msg.partition, msg.offset, msg.leader_epoch)

    def nack(self, msg: Message) -> None:
        """Negative ack: the dispatcher redelivers it after ``nack_delay`` (with
        ``nack_backoff``: ``nack_delay * 2**redelivery_count``, capped)."""
        session = self._session_of(msg)
        key = (msg.partition, msg.offset, msg.leader_epoch)
        with self._lock:
            if session.unacked.pop(key, None) is None:  # atomic against a lock-free ack()
                if not session.active:
                    self._stale += 1
                return
            self._nacked += 1
        cfg = self.config
        hold = 0.0
        if cfg.nack_backoff:
            base = cfg.nack_delay.total_seconds() or _DEFAULT_NACK_DELAY
            hold = backoff_hold(base, cfg.nack_backoff_max.total_seconds(), msg.redelivery_count)
        if hold > 0:
            self._nacks.schedule(hold, lambda: session.outbound.nack(*key))
        else:
            session.outbound.nack(*key)

    def _session_of(self, msg: Message) -> Session:
        session = getattr(msg, "_session", None)
        if not isinstance(session, Session) or session.stream.owner is not self:
            raise InvalidArgument("this message was not received by this consumer")
        return session

    # ---- flow -------------------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop granting permits: what is queued or already granted still arrives."""
        with self._lock:
            self._flow.pause()

    def resume(self) -> None:
        with self._lock:
            self._send(self._flow.resume(self._waiting > 0))

    @property
    def paused(self) -> bool:
        return self._flow.paused

    @property
    def active_partitions(self) -> frozenset[int]:
        """Exclusive/Failover: the partitions this consumer is the active consumer of."""
        with self._lock:
            return frozenset(self._active)

    def stats(self) -> PushConsumerStats:
        with self._lock:
            streams = tuple(
                StreamInfo(
                    s.dispatcher_id,
                    s.address,
                    s.partitions,
                    s.state.value,
                    s.sessions,
                    s.reconnects,
                    None if s.last_error is None else str(s.last_error),
                    s.topic,
                )
                for s in self._streams.values()
            )
            live = [s.session for s in self._streams.values() if s.session is not None]
            unacked = sum(len(session.unacked) for session in live)
            ack_commands = self._ack_commands_ended + sum(
                session.outbound.sent["ack"] for session in live if session.active
            )
            return PushConsumerStats(
                flow=self._flow.stats(),
                unacked=unacked,
                acked=self._acked + self._single_acks.value(),
                nacked=self._nacked,
                stale_acks=self._stale,
                command_errors=self._command_errors,
                handoffs=self._handoffs,
                reroutes=self._reroutes,
                streams=streams,
                active_partitions=frozenset(self._active),
                ack_commands=ack_commands,
            )

    # ---- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Write pending acks, end every stream (the dispatcher gives unacked messages to
        the other consumers) and stop the listener. Idempotent."""
        with self._lock:
            if self._closed:
                return
        self._shutdown(grace=CLOSE_GRACE)
        if self._on_close is not None:
            self._on_close(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> PushConsumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<PushConsumer {self.topic}/{self.subscription} type={self.type} "
            f"consumer_id={self.consumer_id} streams={len(self._streams)}>"
        )


def _ids(msgs: list[Message]) -> Iterator[AckKey]:
    """``(partition, offset, leader epoch)`` of each message, by C-level maps (no Python step per
    message)."""
    return zip(map(_partition_of, msgs), map(_offset_of, msgs), map(_epoch_of, msgs), strict=True)


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def make_config(config: PushConsumerConfig | None, overrides: dict[str, Any]) -> PushConsumerConfig:
    cfg = config or PushConsumerConfig()
    return cfg.replace(**overrides) if overrides else cfg
