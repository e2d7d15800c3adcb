"""The push consumer's streams: one Consume stream per dispatcher, and their callbacks.

``PushSessions`` holds what ``PushConsumer`` (``consumer.py``) is made of: the receiver queue,
the flow control, the streams of the current routing (``_compute_plan``, ``_reroute_locked``)
and the :class:`~sluice.client.push.stream.StreamOwner` callbacks the stream threads call in
with (subscribed, messages, active changes, errors, the end of a session). ``PushConsumer``
adds the application's API (receive, ack, nack, pause, stats, close) and the listener thread.

Locking: one Condition guards the queue, the flow counters and the sessions' unacked sets.
Streams call in from their threads; no callback does I/O under the lock beyond appending to
an :class:`~sluice.client.push.outbound.Outbound`.

Redrive (``config.redrive``, docs/retry.md "Redrive of push subscriptions"): the routing also covers
``<topic>.<subscription>.REDRIVE`` once it exists, so its streams (subscription ``S`` of that topic,
from the earliest offset the first time) feed the same queue, flow and acks. Messages remember their
session, so acks go to the right topic's stream with no other change. Until the topic exists a
watcher thread asks the coordinator for it every ``redrive_check_interval``; a fatal error of a
redrive stream is logged and the consumer goes on with its topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Hashable, Iterator

from sluice.client.links import use_wire
from sluice.client.memory import ClientMemory
from sluice.client.metadata import MetadataCache, TopicInfo
from sluice.client.push.config import PushConsumerConfig
from sluice.client.push.flow import FlowControl, Grant
from sluice.client.push.message import Message, messages_of
from sluice.client.push.nacks import NackScheduler
from sluice.client.push.outbound import Outbound
from sluice.client.push.serde_message import message_kinds
from sluice.client.push.stream import ConsumeCall, ConsumeStream, Session, StreamState
from sluice.client.push.wire_call import WireConsumeCall
from sluice.common.backoff import Backoff
from sluice.common.names import MAX_NAME_LENGTH
from sluice.common.peers import Peers
from sluice.errors import AuthorizationError, RequestTimedOut, SluiceError, UnknownTopicOrPartition
from sluice.retry.levels import REDRIVE_SUFFIX, redrive_topic
from sluice.v1 import dispatcher_pb2 as pb
from sluice.v1 import dispatcher_pb2_grpc

__all__ = ["PushSessions"]

log = logging.getLogger("sluice.client.push.consumer")

_stream_keys = itertools.count(1)
#: Cap of the doubling zero-queue handoff delay.
ZERO_QUEUE_HANDOFF_MAX = 5.0

#: {(topic, dispatcher_id): partitions}: the streams a consumer keeps ("" = no live dispatcher).
Plan = dict[tuple[str, str], tuple[int, ...]]


def redrive_source(topic: str, subscription: str, config: PushConsumerConfig) -> str | None:
    """The redrive topic a consumer of ``topic``/``subscription`` also reads, or None: not asked
    for, a non-durable subscription (nothing lasting to redrive to), zero-queue (its one permit
    would sit on a mostly empty stream), a redrive topic itself, a name over the limit."""
    if not config.redrive or not config.durable or config.zero_queue:
        return None
    if topic.endswith(f".{subscription}{REDRIVE_SUFFIX}"):
        return None
    name = redrive_topic(topic, subscription)
    return name if len(name) <= MAX_NAME_LENGTH else None


class PushSessions:
    """The streams of one push consumer and the state they feed; see the module docstring."""

    def __init__(
        self,
        topic: str,
        subscription: str,
        type_: str,
        config: PushConsumerConfig,
        channels: Peers,
        metadata: MetadataCache,
        client_id: str,
        memory: ClientMemory | None = None,
    ) -> None:
        self.topic = topic
        #: The Client's memory_limit (``client/memory.py``) and the bytes the queue holds in it.
        self._memory = memory if memory is not None else ClientMemory()
        self._queued_bytes = 0
        self.subscription = subscription
        self.type = type_
        self.config = config
        self._listener = config.message_listener
        self._redrive = redrive_source(topic, subscription, config)
        #: Subscribe of the redrive topic: from the earliest offset the first time (it holds nothing
        #: but redriven records, and a later redrive appends behind the subscription's cursor).
        self._redrive_config = config.replace(initial_position="earliest") if self._redrive else config
        self._ended = threading.Event()
        self._watcher: threading.Thread | None = None
        #: Message classes that deserialize (docs/serializers.md); None: plain messages.
        self._kinds = message_kinds(config.key_deserializer, config.value_deserializer)
        self.consumer_id = config.consumer_id or uuid.uuid4().hex
        self.consumer_name = config.consumer_name or client_id
        self._channels = channels
        self._metadata = metadata
        # Hot paths take the plain lock (a C call); only waits and wake-ups use the Condition.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[Message] = deque()
        self._flow = FlowControl(config.receiver_queue_size, autoscale=self._memory.limit > 0)
        self._streams: dict[Hashable, ConsumeStream] = {}
        self._plan: Plan = {}
        self._waiting = 0
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._fatal: SluiceError | None = None
        self._closed = False
        self._acked = self._nacked = self._stale = self._command_errors = 0
        self._active: set[int] = set()
        self._nacks = NackScheduler()
        self._listener_thread: threading.Thread | None = None
        # Zero-queue permit handoff between streams (see _handoff_wait).
        self._handoff_base = config.zero_queue_handoff.total_seconds()
        self._handoff_delay = self._handoff_base
        self._permit_since = 0.0
        self._handoffs = 0
        self._reroutes = 0
        self.ack_group_time = config.ack_group_time.total_seconds()
        #: Ack commands written by sessions that ended (``stats().ack_commands`` adds the live ones).
        self._ack_commands_ended = 0
        try:
            with self._lock:
                self._reroute_locked(self._compute_plan(refresh=False))
            self._wait_subscribed(config.subscribe_timeout.total_seconds())
        except BaseException:
            self._shutdown(grace=0.0)
            raise
        if self._redrive is not None and config.redrive_check_interval.total_seconds() > 0:
            self._watcher = threading.Thread(
                target=self._watch_redrive, daemon=True, name=f"sluice-push-redrive-{subscription}"
            )
            self._watcher.start()

    def _shutdown(self, grace: float) -> None:
        self._ended.set()
        with self._lock:
            self._closed = True
            self._memory.forget(self)
            self._queue.clear()
            self._dequeued(0)
            streams = list(self._streams.values())
            self._wake_all()
        for s in streams:
            s.stop(join=True, grace=grace)
        self._nacks.close()
        for t in (self._listener_thread, self._watcher):
            if t is not None and t is not threading.current_thread():
                t.join(10)

    def _check_usable(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._closed:
            raise SluiceError("the push consumer is closed")

    def _wait_subscribed(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                if self._fatal is not None:
                    raise self._fatal
                # A redrive stream that failed for good is not waited for (``on_fatal``).
                streams = [s for s in self._streams.values() if not self._lost_redrive(s)]
                if streams and all(s.session is not None and s.session.subscribed for s in streams):
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    errors = "; ".join(str(s.last_error) for s in streams if s.last_error is not None)
                    raise RequestTimedOut(
                        f"not subscribed to {self.topic}/{self.subscription} within {timeout:g} s"
                        + (f": {errors}" if errors else "")
                    )
                self._cond.wait(remaining)

    def _compute_plan(self, refresh: bool) -> Plan:
        """The streams of the coordinator's routing: the topic's, and the redrive topic's when it
        exists (one Metadata request for both)."""
        topics = [self.topic] if self._redrive is None else [self.topic, self._redrive]
        try:
            md = self._metadata.get(topics, refresh=refresh, retry=not refresh)
        except AuthorizationError:
            if self._redrive is None:
                raise
            # Not allowed to see the redrive topic: without it (raises if it is the topic itself).
            md = self._metadata.get([self.topic], refresh=refresh, retry=not refresh)
            topics = [self.topic]
        plan = _routing(self.topic, md.topic(self.topic))
        redrive = md.topics.get(self._redrive) if len(topics) > 1 and self._redrive else None
        if redrive is not None and redrive.partitions:
            plan.update(_routing(redrive.name, redrive))
        return dict(sorted(plan.items()))

    def _reroute_locked(self, plan: Plan) -> None:
        """Replace every stream: a new routing means new sessions anyway (Pulsar clears the
        receiver queue on reconnect too); what was queued is redelivered."""
        old = list(self._streams.values())
        self._plan = plan
        self._streams = {}
        self._queue.clear()
        self._dequeued(0)
        cfg = self.config
        for (topic, dispatcher_id), partitions in plan.items():
            key = next(_stream_keys)
            backoff = Backoff(
                cfg.reconnect_backoff.total_seconds(), cfg.reconnect_backoff_max.total_seconds()
            )
            self._streams[key] = ConsumeStream(self, key, dispatcher_id, partitions, backoff, topic)
        minor = [k for k, s in self._streams.items() if s.topic != self.topic]
        self._flow.set_streams(self._streams, minor)
        for s in old:
            s.stop(join=False)
        for s in self._streams.values():
            s.start()

    def _current(self, session: Session) -> bool:
        return session.active and self._streams.get(session.stream.key) is session.stream

    def address_of(self, dispatcher_id: str) -> str | None:
        if not dispatcher_id:
            return None
        d = self._metadata.current().dispatchers.get(dispatcher_id)
        if d is None or not d.alive:
            return None
        return d.address

    def open_consume(
        self, dispatcher_id: str, address: str, commands: Iterator[pb.ConsumerCommand]
    ) -> ConsumeCall:
        d = self._metadata.current().dispatchers.get(dispatcher_id)
        if d is not None and d.wire_address is not None and use_wire():
            return WireConsumeCall(d.wire_address, commands, self.consumer_name, self._channels.security)
        stub = self._channels.stub(address, dispatcher_pb2_grpc.DispatcherStub)
        return stub.Consume(commands)

    def subscribe_request(self, stream: ConsumeStream) -> pb.Subscribe:
        cfg = self.config if stream.topic == self.topic else self._redrive_config
        sub, cid, name = self.subscription, self.consumer_id, self.consumer_name
        return cfg.to_subscribe(stream.topic, sub, self.type, cid, name, stream.partitions)

    def routing_changed(self) -> bool:
        try:
            plan = self._compute_plan(refresh=True)
        except SluiceError as exc:
            if not exc.retriable:
                # The topic is gone (or similar): nothing to reconnect to.
                self._fail(exc)
                return True
            return False  # coordinator unreachable: keep the plan, back off
        with self._lock:
            if self._closed or plan == self._plan:
                return False
            log.info("routing of %s changed: %s -> %s", self.topic, self._plan, plan)
            self._reroutes += 1
            self._reroute_locked(plan)
            self._cond.notify_all()
            return True

    def on_subscribed(self, session: Session) -> None:
        with self._lock:
            if not self._current(session):
                return
            self._send(self._flow.on_subscribed(session.stream.key))
            self._send(self._flow.want_one(self._waiting > 0))
            self._cond.notify_all()  # the constructor waits for this

    def on_messages(self, session: Session, batch: pb.MessageBatch) -> None:
        msgs = messages_of(batch, batch.topic or session.stream.topic, session, self._kinds)
        if not msgs:
            return
        with self._lock:
            if not self._current(session):
                return
            self._flow.on_delivered(session.stream.key, len(msgs))
            self._queue.extend(msgs)
            nbytes = batch.ByteSize()  # the messages share the batch's buffers: count it whole
            self._queued_bytes += nbytes
            self._memory.add(nbytes)
            self._flow.held = self._memory.full(self, self._memory_room)
            self._flow.near_limit = self._memory.near_limit()
            self._handoff_delay = self._handoff_base
            if self._waiting:
                self._cond.notify(len(msgs))
                if self._async_waiters:
                    self._wake_async()

    def on_active_change(self, session: Session, partition: int, active: bool) -> None:
        with self._lock:
            # ``active_partitions`` are the topic's: the redrive topic's partition 0 is another one.
            if not self._current(session) or session.stream.topic != self.topic:
                return
            if active:
                self._active.add(partition)
            else:
                self._active.discard(partition)

    def on_command_error(self, session: Session, error: SluiceError) -> None:
        log.warning("dispatcher rejected a command of %s/%s: %s", self.topic, self.subscription, error)
        with self._lock:
            self._command_errors += 1

    def on_session_end(self, session: Session, reason: SluiceError) -> None:
        with self._lock:
            self._ack_commands_ended += session.outbound.sent["ack"]
            if self._streams.get(session.stream.key) is not session.stream:
                return
            if session.subscribed:
                self._flow.on_disconnected(session.stream.key)
                before = len(self._queue)
                self._queue = deque(m for m in self._queue if m._session is not session)
                self._dequeued(len(self._queue), before)
                if session.stream.topic == self.topic:
                    self._active.difference_update(session.stream.partitions)
                if not self._closed:
                    log.info("push stream to %s lost: %s", session.stream.dispatcher_id, reason)
            # A zero-queue permit held by the lost stream moves to a live one.
            self._send(self._flow.want_one(self._waiting > 0))

    def on_fatal(self, stream: ConsumeStream, error: SluiceError) -> None:
        with self._lock:
            if self._streams.get(stream.key) is not stream:
                return
            redrive = stream.topic != self.topic
            if redrive:
                # E.g. ConsumerBusy: an Exclusive consumer opened on the redrive topic by hand.
                log.warning(
                    "push consumer %s/%s goes on without its redrive topic %s: %s",
                    self.topic,
                    self.subscription,
                    stream.topic,
                    error,
                )
                self._cond.notify_all()  # the constructor no longer waits for it
        if not redrive:
            self._fail(error)
        elif isinstance(error, UnknownTopicOrPartition):
            self.routing_changed()  # deleted: routed without it, and looked for again

    def _lost_redrive(self, stream: ConsumeStream) -> bool:
        return stream.topic != self.topic and stream.state is StreamState.FAILED

    def _watch_redrive(self) -> None:
        """Until closed: while the redrive topic is not routed, ask for it every interval, and
        reroute once it exists (every stream is replaced, as on any routing change). Waits on an
        event, so close() ends it at once."""
        redrive = self._redrive
        assert redrive is not None
        interval = self.config.redrive_check_interval.total_seconds()
        while not self._ended.wait(interval):
            if self._fatal is not None:
                return
            if any(topic == redrive for topic, _ in self._plan):
                continue
            try:
                found = redrive in self._metadata.get([redrive], refresh=True, retry=False).topics
            except SluiceError as exc:
                log.debug("looking for %s: %s", redrive, exc)
                continue
            if found:
                log.info("push consumer %s/%s: found %s", self.topic, self.subscription, redrive)
                self.routing_changed()

    def _fail(self, error: SluiceError) -> None:
        self._ended.set()
        with self._lock:
            if self._fatal is not None or self._closed:
                return
            log.error("push consumer %s/%s failed: %s", self.topic, self.subscription, error)
            self._fatal = error
            self._queue.clear()
            self._dequeued(0)
            streams = list(self._streams.values())
            self._wake_all()
        for s in streams:
            s.stop(join=False)

    def _handoff_wait(self) -> float | None:
        """Zero-queue over several streams: seconds until the outstanding permit should move
        to another stream (None: never). Moves it when that time has come.

        A permit cannot be taken back on the wire, so the idle stream is resubscribed: the
        dispatcher drops the old consumer (and its permit) and the next grant goes to the
        next stream. Only when nothing the application holds came from that stream (those
        messages would be redelivered) and only for Shared/Key_Shared (resubscribing a
        Failover consumer could move its partitions to a standby). Under the lock.
        """
        key = self._flow.holder
        if key is None or not self._handoff_base or len(self._streams) < 2:
            return None
        if self.type not in ("shared", "key_shared"):
            return None
        due = self._permit_since + self._handoff_delay - time.monotonic()
        if due > 0:
            return due
        stream = self._streams.get(key)
        session = stream.session if stream is not None else None
        if stream is None or session is None or session.unacked:
            return None
        self._handoffs += 1
        self._handoff_delay = min(self._handoff_delay * 2, ZERO_QUEUE_HANDOFF_MAX)
        self._flow.on_idle(key)
        stream.handoff()  # on_session_end then grants the permit to the next stream
        return None

    # ---- memory_limit (docs/memory.md, "SDK") ------------------------------------------------

    def _dequeued(self, left: int, before: int | None = None) -> int:
        """Messages left the queue (``before`` -> ``left``; None: all, it was cleared): release
        their share of the queue's bytes, pro rata (a batch's messages share its buffers), and
        return it. Under the lock."""
        held = self._queued_bytes
        if held <= 0:
            return 0
        before = before if before is not None else left + 1
        share = held if left == 0 else held * (before - left) // max(before, 1)
        self._queued_bytes -= share
        self._memory.release(share)
        return share

    def _requeued(self, nbytes: int) -> None:
        """Taken messages went back to the queue: their bytes count again. Under the lock."""
        self._queued_bytes += nbytes
        self._memory.add(nbytes)

    def _memory_room(self) -> None:
        """The Client's memory limit has room again (called on the memory's own thread)."""
        with self._lock:
            if self._closed or self._fatal is not None:
                return
            if self._memory.full(self, self._memory_room):
                return  # taken again meanwhile: woken at the next release
            self._send(self._flow.unhold())

    def _send(self, grants: list[Grant]) -> list[tuple[Outbound, int]]:
        """Hand ``grants`` to their sessions; returns each grant's outbound and number."""
        if grants and self._flow.zero_queue:
            self._permit_since = time.monotonic()
        sent = []
        for key, permits in grants:
            stream = self._streams.get(key)
            session = stream.session if stream is not None else None
            if session is not None and session.active:
                sent.append((session.outbound, session.outbound.flow(permits)))
        return sent

    def _wake_all(self) -> None:
        self._cond.notify_all()
        self._wake_async()

    def _wake_async(self) -> None:
        for loop, fut in self._async_waiters:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(_resolve, fut)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _routing(topic: str, info: TopicInfo) -> Plan:
    """The topic's partitions grouped by the dispatcher the coordinator routes them to."""
    plan: dict[tuple[str, str], list[int]] = {}
    for p in info.partitions:
        plan.setdefault((topic, p.dispatcher_id), []).append(p.partition)
    return {k: tuple(sorted(ps)) for k, ps in plan.items()}
