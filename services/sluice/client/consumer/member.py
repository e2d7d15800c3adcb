"""The group member: a coroutine on the Client's group driver that heartbeats the coordinator.

The protocol decisions are :class:`~sluice.client.consumer.membership.Membership`'s;
this module only does the I/O: the member's coroutine waits (on an asyncio Event and
the loop's timer, not a sleep loop) until a heartbeat is due or asked for, sends it,
feeds the answer to the state machine and hands the resulting events to the
consumer's ``on_events`` callback (which queues them for ``poll()``).

Every member of a Client runs on that Client's one :class:`GroupDriver` loop (one
thread, one ``grpc.aio`` channel to the coordinator), so a member costs no thread of
its own (docs/consumer.md, "Many consumers on one Client").

Heartbeats go over one long-lived ``ConsumerGroupStream`` (:class:`HeartbeatStream`)
unless ``heartbeat_stream`` is off or the coordinator does not implement it (then the
unary ``Heartbeat`` RPC, one call each). On the stream, answers are read by a reader
task, and the coordinator may send ``heartbeat_now`` unasked when a rebalance needs
this member (a new target, a partition it waits for came free): the next heartbeat
then goes at once instead of at the interval. A broken stream is not a lost
membership: the heartbeat in flight fails like a failed RPC (retried with backoff
on a new stream), and only a whole session timeout without an answer loses it.

Caller: the Consumer. Thread-safe: the state machine is guarded by a threading
Condition, which the application's threads wait on for answers; the loop holds it only
briefly and never awaits under it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from sluice.client.consumer.config import ConsumerConfig
from sluice.client.consumer.group_driver import GroupDriver
from sluice.client.consumer.membership import (
    Event,
    Fatal,
    HeartbeatPlan,
    Membership,
    MemberState,
    TargetPartition,
)
from sluice.client.metadata import MetadataCache
from sluice.client.rpc import call, error_from_rpc, is_unimplemented
from sluice.errors import (
    AuthenticationError,
    AuthorizationError,
    BrokerNotAvailable,
    RequestTimedOut,
    SluiceError,
    UnknownTopicOrPartition,
    error_from_proto,
)
from sluice.v1 import common_pb2, coordinator_pb2

__all__ = ["GroupMember", "HeartbeatStream"]

log = logging.getLogger("sluice.consumer.member")

TopicPartition = tuple[str, int]
_MODELS = {
    "clustering": coordinator_pb2.MESSAGE_MODEL_CLUSTERING,
    "broadcasting": coordinator_pb2.MESSAGE_MODEL_BROADCASTING,
}


class HeartbeatStream:
    """One open ``ConsumerGroupStream`` call (``grpc.aio``, on the driver's loop). The member's
    coroutine writes each heartbeat (``send``); a reader task hands every message to
    ``on_message`` and the end of the call (None: ended by the server or cancelled; else the
    error) to ``on_closed``, once. Use from the loop only.

    Written with ``call.write`` rather than a request iterator: an iterator costs a queue, a
    generator and gRPC's task consuming it per member (about 6 KB of the ~60 a consumer held)."""

    def __init__(
        self,
        stub: Any,
        on_message: Callable[[HeartbeatStream, coordinator_pb2.GroupStreamResponse], None],
        on_closed: Callable[[HeartbeatStream, grpc.RpcError | None], None],
    ) -> None:
        self._on_message = on_message
        self._on_closed = on_closed
        # No deadline: the call lives as long as the member; each heartbeat has its own timeout.
        self._call = stub.ConsumerGroupStream()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def send(self, request: coordinator_pb2.GroupHeartbeatRequest) -> None:
        """Write one heartbeat. A write that fails (the call ended) is not reported here: the
        reader reports the end of the call, with the server's status."""
        try:
            await self._call.write(coordinator_pb2.GroupStreamRequest(heartbeat=request))
        except (grpc.RpcError, asyncio.InvalidStateError) as exc:
            log.debug("heartbeat stream write failed: %r", exc)

    def close(self) -> None:
        """End the call; the reader reports it closed."""
        self._call.cancel()

    async def _read(self) -> None:
        error: grpc.RpcError | None = None
        try:
            async for message in self._call:
                self._on_message(self, message)
        except grpc.RpcError as exc:
            error = exc
        except asyncio.CancelledError:
            pass  # closed by us (or the loop stopping): nobody waits for its answers any more
        except Exception:  # never let the reader die silently
            log.exception("heartbeat stream reader failed")
            self._call.cancel()
        self._on_closed(self, error)


class GroupMember:
    def __init__(
        self,
        driver: GroupDriver,
        metadata: MetadataCache,
        group: str,
        subscription: Mapping[str, str],
        config: ConsumerConfig,
        client_id: str,
        on_events: Callable[[list[Event]], None],
    ) -> None:
        self.group = group
        self._driver = driver
        self._metadata = metadata
        self._subscription = dict(subscription)
        self._config = config
        self._client_id = client_id
        self._on_events = on_events
        #: Guards the state machine; the application's threads wait on it for answers.
        self._cond = threading.Condition()
        self._m = Membership(
            instance_id=config.instance_id, session_timeout=config.session_timeout.total_seconds()
        )
        self._stopping = False
        # A heartbeat RPC must end well within the session, or a slow answer costs the membership.
        self._rpc_timeout = min(
            config.request_timeout.total_seconds(), config.session_timeout.total_seconds()
        )
        self._use_stream = config.heartbeat_stream
        #: The loop's: the open stream, and when the heartbeat in flight on it times out.
        self._stream: HeartbeatStream | None = None
        self._stream_deadline: float | None = None
        #: Set (on the loop) when something may make a heartbeat due sooner, or the member stops.
        self._wake = asyncio.Event()
        self._task: concurrent.futures.Future[None] | None = None

    # ---- lifecycle (Caller: Consumer) ------------------------------------------------------------------

    def start(self) -> None:
        self._task = self._driver.submit(self._run())

    def wait_first_answer(self, timeout: float) -> None:
        """Wait until the coordinator answered the join (or refused it: raised here)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._m.answered == 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RequestTimedOut(
                        f"group {self.group}: the coordinator did not answer the join within {timeout:g} s"
                    )
                self._cond.wait(remaining)
            if self._m.state is MemberState.FATAL and self._m.error is not None:
                raise self._m.error

    def close(self, leave: bool = True) -> None:
        """Stop heartbeating; then (``leave``) send LeaveGroup, epoch -1 (or -2 when static)."""
        with self._cond:
            self._stopping = True
            plan = self._m.leave()
            self._cond.notify_all()
        self._poke()
        task = self._task
        if task is not None:
            try:
                task.result(self._rpc_timeout + 1)  # its end closes the stream
            except Exception as exc:  # timed out, or the driver stopped under it
                log.debug("group %s: heartbeat task ended with %r", self.group, exc)
        if plan is None or not leave:
            return
        request = coordinator_pb2.LeaveGroupRequest(
            group=self.group, member_id=plan.member_id, member_epoch=plan.member_epoch
        )
        try:
            call(self._metadata.coordinator_stub().LeaveGroup, request, self._rpc_timeout)
        except SluiceError as exc:
            # The session timeout removes the member anyway; its partitions just move later.
            log.warning(
                "group %s: LeaveGroup failed (%s); the session timeout will remove us", self.group, exc
            )
        with self._cond:
            self._m.left()

    # ---- the consumer's view (Caller: Consumer, application thread) -----------------------------------

    @property
    def member_id(self) -> str:
        return self._m.member_id

    @property
    def member_epoch(self) -> int:
        return self._m.member_epoch

    @property
    def state(self) -> MemberState:
        return self._m.state

    @property
    def answered(self) -> int:
        return self._m.answered

    def set_owned(self, owned: frozenset[TopicPartition]) -> None:
        with self._cond:
            self._m.set_owned(owned)

    def released(self, partitions: frozenset[TopicPartition]) -> None:
        """Revoked partitions were committed and handed back: heartbeat now."""
        with self._cond:
            self._m.released(partitions, time.monotonic())
        self._poke()

    def lost_handled(self) -> None:
        with self._cond:
            self._m.lost_handled(time.monotonic())
        self._poke()

    def heartbeat_now(self) -> None:
        with self._cond:
            self._m.heartbeat_now(time.monotonic())
        self._poke()

    def resubscribe(self, subscription: Mapping[str, str], timeout: float) -> None:
        """Heartbeat ``subscription`` from now on, at once, and wait for the answer to it (the coordinator
        moves the target: the consumer's poll() revokes and assigns). A refusal is fatal, as at the join,
        and raised here; a topic missing from the metadata is refused before anything is sent, so a typo
        does not end the membership."""
        known = self._metadata.get(subscription, refresh=True).topics
        missing = sorted(t for t in subscription if t not in known)
        if missing:
            raise UnknownTopicOrPartition(f"topic {missing[0]!r} does not exist", topic=missing[0])
        with self._cond:
            if self._m.state is MemberState.FATAL and self._m.error is not None:
                raise self._m.error
            self._subscription = dict(subscription)
            # The answer to a heartbeat in flight may predate the change: wait for the one after it.
            after = self._m.answered + (1 if self._m.in_flight else 0)
            self._m.heartbeat_now(time.monotonic())
        self._poke()
        if not self.wait_answer_after(after, timeout):
            raise RequestTimedOut(f"group {self.group}: the new subscription had no answer in {timeout:g} s")
        with self._cond:
            if self._m.state is MemberState.FATAL and self._m.error is not None:
                raise self._m.error

    def wait_answer_after(self, answered: int, timeout: float) -> bool:
        """Wait until a heartbeat newer than count ``answered`` was answered."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._m.answered <= answered and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return self._m.answered > answered

    def _poke(self) -> None:
        """Make the member's coroutine look at its state again (any thread)."""
        self._driver.call_soon(self._wake.set)

    # ---- the member's coroutine (on the driver's loop) -----------------------------------------------

    @property
    def streaming(self) -> bool:
        """Whether heartbeats go over the stream (False after falling back to the unary RPC)."""
        return self._use_stream

    async def _run(self) -> None:
        if self._use_stream and await self._driver.streams_supported(self._rpc_timeout) is False:
            log.info("group %s: the coordinator has no heartbeat stream; using the unary RPC", self.group)
            self._use_stream = False
        try:
            while True:
                # Cleared before the state is read: a poke after the read sets it again.
                self._wake.clear()
                events: list[Event] = []
                plan: HeartbeatPlan | None = None
                write: tuple[HeartbeatStream, coordinator_pb2.GroupHeartbeatRequest] | None = None
                sleep: float | None = -1.0
                with self._cond:
                    if self._stopping:
                        return
                    now = time.monotonic()
                    if self._stream_deadline is not None and now >= self._stream_deadline:
                        events = self._stream_failed(
                            now, RequestTimedOut(f"no heartbeat answer within {self._rpc_timeout:g} s")
                        )
                    else:
                        due = self._m.next_due()
                        if due is not None and due <= now:
                            plan = self._m.request(now)
                            if self._use_stream:
                                events, write = self._send_on_stream(plan, now)
                                plan = None
                        else:
                            wake = [t for t in (due, self._stream_deadline) if t is not None]
                            sleep = min(wake) - now if wake else None
                if plan is not None:
                    events = await self._heartbeat(plan)
                elif write is not None:
                    await write[0].send(write[1])
                self._deliver(events)
                if sleep is None or sleep >= 0:
                    await self._sleep(sleep)
        finally:
            stream, self._stream = self._stream, None
            if stream is not None:
                stream.close()

    async def _sleep(self, seconds: float | None) -> None:
        """Until ``seconds`` pass (None: for ever) or the member is poked."""
        try:
            async with asyncio.timeout(seconds):
                await self._wake.wait()
        except TimeoutError:
            pass

    def _deliver(self, events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, Fatal):
                log.error("group %s: %s", self.group, ev.error)
        if events:
            self._on_events(events)

    def _request(self, plan: HeartbeatPlan) -> coordinator_pb2.GroupHeartbeatRequest:
        cfg = self._config
        return coordinator_pb2.GroupHeartbeatRequest(
            group=self.group,
            member_id=plan.member_id,
            member_epoch=plan.member_epoch,
            instance_id=cfg.instance_id,
            subscription=self._subscription,
            assignor=cfg.assignor,
            message_model=_MODELS[cfg.message_model],
            owned=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in plan.owned],
            rebalance_timeout_ms=cfg.rebalance_timeout_ms,
            session_timeout_ms=cfg.session_timeout_ms,
            client_id=self._client_id,
        )

    # ---- the unary RPC ---------------------------------------------------------------------------------

    async def _heartbeat(self, plan: HeartbeatPlan) -> list[Event]:
        request = self._request(plan)
        error: SluiceError | None = None
        resp = None
        try:
            resp = await self._driver.stub.Heartbeat(request, timeout=self._rpc_timeout)
        except grpc.RpcError as exc:
            error = error_from_rpc(exc)
        except Exception as exc:  # never let the member's coroutine die silently
            log.exception("group %s: heartbeat failed", self.group)
            error = SluiceError(f"heartbeat failed: {exc!r}")
        with self._cond:
            events = self._absorb(time.monotonic(), resp, error)
            self._cond.notify_all()
        return events

    def _absorb(
        self, now: float, resp: coordinator_pb2.GroupHeartbeatResponse | None, error: SluiceError | None
    ) -> list[Event]:
        """Feed one heartbeat's outcome to the state machine. Caller holds the condition (and
        notifies it: the application may wait for an answer)."""
        if error is None and resp is not None:
            error = error_from_proto(resp.error)
        if error is not None or resp is None:
            error = error or SluiceError("heartbeat answered nothing")
            if error.retriable:
                log.debug("group %s: heartbeat failed, retrying: %s", self.group, error)
            else:
                log.info("group %s: heartbeat refused: %s", self.group, error)
            return self._m.on_error(now, error)
        assignment = None
        if resp.HasField("assignment"):
            assignment = [
                TargetPartition(p.topic, p.partition, p.track or "default", p.filter or "*")
                for p in resp.assignment.partitions
            ]
        return self._m.on_response(
            now, resp.member_id, resp.member_epoch, resp.heartbeat_interval_ms, assignment
        )

    # ---- the stream ------------------------------------------------------------------------------------

    def _send_on_stream(
        self, plan: HeartbeatPlan, now: float
    ) -> tuple[list[Event], tuple[HeartbeatStream, coordinator_pb2.GroupHeartbeatRequest] | None]:
        """Open a stream if needed and start the clock on ``plan``: the stream and request to
        write (after the condition is released), or the events of failing to open one. Caller
        holds the condition."""
        request = self._request(plan)
        try:
            if self._stream is None:
                self._stream = HeartbeatStream(
                    self._driver.stub, self._on_stream_message, self._on_stream_closed
                )
        except Exception as exc:  # e.g. the client was closed: like a failed RPC
            self._stream = None
            failed = BrokerNotAvailable(f"cannot open the heartbeat stream: {exc!r}")
            return self._m.on_error(now, failed), None
        self._stream_deadline = now + self._rpc_timeout
        return [], (self._stream, request)

    def _stream_failed(self, now: float, error: SluiceError) -> list[Event]:
        """The heartbeat in flight on the stream failed: drop the stream (the next heartbeat opens a new
        one) and count a failed heartbeat. Caller holds the condition."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        self._stream_deadline = None
        return self._m.on_error(now, error) if self._m.in_flight else []

    def _on_stream_message(
        self, stream: HeartbeatStream, message: coordinator_pb2.GroupStreamResponse
    ) -> None:
        events: list[Event] = []
        with self._cond:
            if stream is not self._stream or self._stopping:
                return  # a stream given up on: its late answers mean nothing
            now = time.monotonic()
            kind = message.WhichOneof("kind")
            if kind == "heartbeat" and self._stream_deadline is not None:
                self._stream_deadline = None
                events = self._absorb(now, message.heartbeat, None)
                refusal = error_from_proto(message.heartbeat.error)
                if refusal is not None and refusal.retriable:
                    # NOT_COORDINATOR and the like: the next heartbeat opens a new stream, which may
                    # reach another coordinator.
                    self._stream = None
                    stream.close()
            elif kind == "heartbeat_now":
                self._m.heartbeat_now(now)
            self._cond.notify_all()
        self._wake.set()  # the next heartbeat's time changed
        self._deliver(events)

    def _on_stream_closed(self, stream: HeartbeatStream, error: grpc.RpcError | None) -> None:
        events: list[Event] = []
        with self._cond:
            if stream is not self._stream or self._stopping:
                return
            self._stream = None
            now = time.monotonic()
            in_flight = self._stream_deadline is not None
            self._stream_deadline = None
            if error is not None and is_unimplemented(error):
                self._driver.streams_unsupported()
                log.info("group %s: the coordinator has no heartbeat stream; using the unary RPC", self.group)
                self._use_stream = False
                if in_flight:
                    self._m.resend(now)
            elif in_flight:
                failure = error_from_rpc(error) if error is not None else None
                refused = isinstance(failure, AuthenticationError | AuthorizationError)
                if failure is None or not (failure.retriable or refused):
                    # A stream failing is the transport's doing, never a refusal of this member,
                    # unless security refused it (no credentials, no right to the group): that is
                    # final, as it would be on the unary heartbeat.
                    failure = BrokerNotAvailable(
                        f"heartbeat stream closed: {failure or 'by the coordinator'}"
                    )
                events = self._m.on_error(now, failure)
            self._cond.notify_all()
        self._wake.set()
        self._deliver(events)
