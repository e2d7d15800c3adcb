"""One Consume stream to one dispatcher, kept alive: connect, subscribe, read, reconnect.

A :class:`ConsumeStream` serves the partitions of the topic that the coordinator
routes to one dispatcher. Its thread runs the session loop:

1. resolve the dispatcher's address from the cluster metadata (refreshed after a failure);
2. open ``Consume``, send ``Subscribe`` (always with the consumer's one ``consumer_id``, so
   a resubscription replaces the old consumer on the dispatcher, idempotently);
3. read events until the stream ends, handing them to the owner (the PushConsumer);
4. after a retriable failure wait the backoff (100 ms doubling to 60 s, reset once
   subscribed) and start again. ``NOT_DISPATCHER`` skips the wait: the owner refreshes
   the routing and, if it changed, replaces the streams. A non-retriable error
   (``CONSUMER_BUSY``, ``SUBSCRIPTION_TYPE_MISMATCH``, an unknown topic, ...) ends the loop
   and is reported to the owner, which raises it to the application.

Each session is a :class:`Session`: messages remember theirs, so an ack for a message
of a session that ended is dropped (the dispatcher redelivers what it never got acked).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Hashable, Iterator
from typing import Protocol

import grpc

from sluice.client.push.outbound import Outbound
from sluice.client.push.unacked import Unacked
from sluice.client.rpc import error_from_rpc
from sluice.common.backoff import Backoff
from sluice.errors import (
    BrokerNotAvailable,
    NotDispatcher,
    SluiceError,
    UnknownSubscription,
    UnknownTopicOrPartition,
    error_from_proto,
)
from sluice.v1 import dispatcher_pb2 as pb

__all__ = ["ConsumeStream", "Session", "StreamOwner", "StreamState"]

log = logging.getLogger(__name__)

#: Errors after Subscribed that end the stream (routing moved, topic or subscription deleted).
#: Any other error on a subscribed stream concerns one command (an unknown message id, bad
#: permits) and the stream stays usable; before Subscribed, every error ends it.
STREAM_ENDING: tuple[type[SluiceError], ...] = (NotDispatcher, UnknownTopicOrPartition, UnknownSubscription)


class StreamState(enum.Enum):
    """CONNECTING -> SUBSCRIBED -> BACKOFF -> CONNECTING ...; any -> CLOSED or FAILED (final)."""

    CONNECTING = "connecting"
    SUBSCRIBED = "subscribed"
    BACKOFF = "backoff"
    FAILED = "failed"
    CLOSED = "closed"
    UNKNOWN = "unknown"


_TRANSITIONS = {
    StreamState.CONNECTING: {
        StreamState.SUBSCRIBED,
        StreamState.BACKOFF,
        StreamState.CONNECTING,
        StreamState.FAILED,
        StreamState.CLOSED,
    },
    StreamState.SUBSCRIBED: {
        StreamState.BACKOFF,
        StreamState.CONNECTING,
        StreamState.FAILED,
        StreamState.CLOSED,
    },
    StreamState.BACKOFF: {StreamState.CONNECTING, StreamState.CLOSED},
    StreamState.FAILED: {StreamState.CLOSED},
    StreamState.CLOSED: set(),
}


class Session:
    """One connection of a stream: from Subscribe to the end of the call."""

    __slots__ = ("active", "number", "outbound", "stream", "subscribed", "unacked")

    def __init__(self, stream: ConsumeStream, number: int, outbound: Outbound) -> None:
        self.stream = stream
        self.number = number
        self.outbound = outbound
        self.active = True
        self.subscribed = False
        #: (partition, offset, leader epoch) taken by the application and not acked or nacked yet
        #: (a dict for its atomic test-and-remove: ``unacked.py``).
        self.unacked: Unacked = {}


class ConsumeCall(Protocol):
    """A Consume stream: iterate it for events (on the stream's thread), cancel it from any thread.
    gRPC's call object is one; ``wire_call.WireConsumeCall`` is the other."""

    def __iter__(self) -> Iterator[pb.DispatcherEvent]: ...

    def cancel(self) -> object: ...


class StreamOwner(Protocol):
    """What a stream needs from its consumer. Every call comes from the stream's thread."""

    #: Seconds a session's acks are grouped before they are written (``Outbound``).
    ack_group_time: float

    def address_of(self, dispatcher_id: str) -> str | None: ...
    def subscribe_request(self, stream: ConsumeStream) -> pb.Subscribe: ...
    def open_consume(
        self, dispatcher_id: str, address: str, commands: Iterator[pb.ConsumerCommand]
    ) -> ConsumeCall:
        """A Consume stream to the dispatcher (its wire port when it serves one, else gRPC)."""
        ...

    def on_subscribed(self, session: Session) -> None: ...
    def on_messages(self, session: Session, batch: pb.MessageBatch) -> None: ...
    def on_active_change(self, session: Session, partition: int, active: bool) -> None: ...
    def on_command_error(self, session: Session, error: SluiceError) -> None: ...
    def on_session_end(self, session: Session, reason: SluiceError) -> None: ...
    def on_fatal(self, stream: ConsumeStream, error: SluiceError) -> None: ...
    def routing_changed(self) -> bool:
        """Refresh the metadata; True when the owner replaced the streams because of it."""
        ...


class ConsumeStream:
    """Caller: PushConsumer (start/stop), its own thread (everything else)."""

    def __init__(
        self,
        owner: StreamOwner,
        key: Hashable,
        dispatcher_id: str,
        partitions: tuple[int, ...],
        backoff: Backoff,
        topic: str,
    ) -> None:
        self.owner = owner
        self.key = key
        #: The consumer's topic, or its redrive topic (docs/retry.md).
        self.topic = topic
        self.dispatcher_id = dispatcher_id
        self.partitions = partitions
        self.backoff = backoff
        self.state = StreamState.CONNECTING
        self.session: Session | None = None
        self.address: str | None = None
        self.sessions = 0
        self.reconnects = 0
        self.last_error: SluiceError | None = None
        self._stop = threading.Event()
        self._handoff = False
        self._lock = threading.Lock()
        self._call: ConsumeCall | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"sluice-push-{dispatcher_id}")

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, join: bool = True, grace: float = 0.0) -> None:
        """End the stream for good (idempotent). Safe from any thread, including its own.

        ``grace`` > 0: first write what is pending (acks above all), half-close, and give
        the dispatcher that long to end the stream, so nothing acked is redelivered.
        """
        self._stop.set()
        own = threading.current_thread() is self._thread
        with self._lock:
            call, session = self._call, self.session
        if grace > 0 and not own and call is not None and session is not None and session.active:
            session.outbound.finish()
            self._thread.join(grace)
        if session is not None:
            session.outbound.close()
        if call is not None:
            call.cancel()
        if join and not own and self._thread.is_alive():
            self._thread.join(10)

    def handoff(self) -> None:
        """End the current session and subscribe again at once, without a backoff: the
        dispatcher drops the permits it held for this consumer (zero-queue handoff)."""
        with self._lock:
            call = self._call
            self._handoff = call is not None
        if call is not None:
            call.cancel()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _transition(self, to: StreamState) -> None:
        if to not in _TRANSITIONS.get(self.state, set()):
            log.error("stream %s: unexpected transition %s -> %s", self.dispatcher_id, self.state, to)
        self.state = to

    # ---- the session loop ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.state is not StreamState.CONNECTING:
                    self._transition(StreamState.CONNECTING)
                reason = self._attempt()
                if self._stop.is_set():
                    break
                if reason is None:
                    continue
                if self._handoff:
                    self._handoff = False
                    continue
                self.last_error = reason
                if not reason.retriable:
                    self._transition(StreamState.FAILED)
                    self.owner.on_fatal(self, reason)
                    return
                if self.owner.routing_changed():
                    return  # the owner replaced the streams; this one is stopped
                if isinstance(reason, NotDispatcher) and self.backoff.attempts == 0:
                    # The coordinator moved the partitions: go to the new owner now, once;
                    # a repeat (metadata not caught up yet) waits like any other failure.
                    self.backoff.next()
                    continue
                self._transition(StreamState.BACKOFF)
                delay = self.backoff.next()
                log.info("stream to %s ended (%s); reconnecting in %.2f s", self.dispatcher_id, reason, delay)
                # A backoff, not a poll: wakes at once when the stream is stopped.
                self._stop.wait(delay)
        except Exception as exc:  # a bug must not kill the consumer silently
            log.exception("push stream %s crashed", self.dispatcher_id)
            self.owner.on_fatal(self, SluiceError(f"push stream crashed: {exc!r}"))
        finally:
            if self.state is not StreamState.FAILED:
                self.state = StreamState.CLOSED

    def _attempt(self) -> SluiceError | None:
        """One connection: returns why it ended (None: stopped or nothing to connect to yet)."""
        try:
            address = self.owner.address_of(self.dispatcher_id)
        except SluiceError as exc:
            return exc
        if address is None:
            return BrokerNotAvailable(f"dispatcher {self.dispatcher_id or '(none)'} is not alive")
        self.address = address
        self.sessions += 1
        if self.sessions > 1:
            self.reconnects += 1
        outbound = Outbound(self.owner.subscribe_request(self), self.owner.ack_group_time)
        session = Session(self, self.sessions, outbound)
        with self._lock:
            if self._stop.is_set():
                return None
            self.session = session
            call = self.owner.open_consume(self.dispatcher_id, address, iter(outbound))
            self._call = call
        reason: SluiceError | None = None
        try:
            for event in call:
                kind = event.WhichOneof("event")
                if kind == "messages":
                    self.owner.on_messages(session, event.messages)
                elif kind == "subscribed":
                    session.subscribed = True
                    # A dispatcher that sends record batches also takes acks as ranges.
                    outbound.ack_ranges = event.subscribed.record_batches
                    self.backoff.reset()
                    self._transition(StreamState.SUBSCRIBED)
                    self.owner.on_subscribed(session)
                elif kind == "active_change":
                    ch = event.active_change
                    self.owner.on_active_change(session, ch.partition, ch.is_active)
                elif kind == "error":
                    err = error_from_proto(event.error) or SluiceError(event.error.message)
                    if session.subscribed and not isinstance(err, STREAM_ENDING):
                        self.owner.on_command_error(session, err)
                    else:
                        reason = err  # the dispatcher ends the stream after it
            if reason is None:
                reason = BrokerNotAvailable(f"dispatcher {self.dispatcher_id} ended the stream")
        except grpc.RpcError as exc:
            reason = reason or error_from_rpc(exc)
        except SluiceError as exc:  # a wire connection's failure
            reason = reason or exc
        finally:
            outbound.close()
            with self._lock:
                session.active = False
                self._call = None
            self.owner.on_session_end(session, reason or BrokerNotAvailable("stream stopped"))
        return None if self._stop.is_set() else reason
