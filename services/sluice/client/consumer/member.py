"""The group member: a background thread that heartbeats the coordinator.

The protocol decisions are :class:`~sluice.client.consumer.membership.Membership`'s;
this module only does the I/O: it waits (on a Condition, not a sleep loop) until a
heartbeat is due or asked for, sends it, feeds the answer to the state machine and
hands the resulting events to the consumer's ``on_events`` callback (which queues
them for ``poll()``).

Caller: the Consumer. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from sluice.client.consumer.config import ConsumerConfig
from sluice.client.consumer.membership import (
    Event,
    Fatal,
    HeartbeatPlan,
    Membership,
    MemberState,
    TargetPartition,
)
from sluice.client.metadata import MetadataCache
from sluice.client.rpc import call
from sluice.errors import RequestTimedOut, SluiceError, error_for_code
from sluice.v1 import common_pb2, coordinator_pb2

__all__ = ["GroupMember"]

log = logging.getLogger("sluice.consumer.member")

TopicPartition = tuple[str, int]
_MODELS = {
    "clustering": coordinator_pb2.MESSAGE_MODEL_CLUSTERING,
    "broadcasting": coordinator_pb2.MESSAGE_MODEL_BROADCASTING,
}


class GroupMember:
    def __init__(
        self,
        metadata: MetadataCache,
        group: str,
        subscription: Mapping[str, str],
        config: ConsumerConfig,
        client_id: str,
        on_events: Callable[[list[Event]], None],
    ) -> None:
        self.group = group
        self._metadata = metadata
        self._subscription = dict(subscription)
        self._config = config
        self._client_id = client_id
        self._on_events = on_events
        self._cond = threading.Condition()
        self._m = Membership(
            instance_id=config.instance_id, session_timeout=config.session_timeout.total_seconds()
        )
        self._stopping = False
        # A heartbeat RPC must end well within the session, or a slow answer costs the membership.
        self._rpc_timeout = min(
            config.request_timeout.total_seconds(), config.session_timeout.total_seconds()
        )
        self._thread = threading.Thread(target=self._run, name=f"sluice-heartbeat-{group}", daemon=True)

    # ---- lifecycle (Caller: Consumer) ------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

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
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self._rpc_timeout + 1)
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
            self._cond.notify_all()

    def lost_handled(self) -> None:
        with self._cond:
            self._m.lost_handled(time.monotonic())
            self._cond.notify_all()

    def heartbeat_now(self) -> None:
        with self._cond:
            self._m.heartbeat_now(time.monotonic())
            self._cond.notify_all()

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

    # ---- the heartbeat thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    now = time.monotonic()
                    due = self._m.next_due()
                    if due is not None and due <= now:
                        plan = self._m.request(now)
                        break
                    self._cond.wait(None if due is None else due - now)
            events = self._heartbeat(plan)
            if events:
                self._on_events(events)

    def _heartbeat(self, plan: HeartbeatPlan) -> list[Event]:
        cfg = self._config
        request = coordinator_pb2.GroupHeartbeatRequest(
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
        error: SluiceError | None = None
        resp = None
        try:
            resp = call(self._metadata.coordinator_stub().Heartbeat, request, self._rpc_timeout)
            if resp.error.code != common_pb2.NONE:
                error = error_for_code(resp.error.code, resp.error.message)
        except SluiceError as exc:
            error = exc
        except Exception as exc:  # never let the heartbeat thread die silently
            log.exception("group %s: heartbeat failed", self.group)
            error = SluiceError(f"heartbeat failed: {exc!r}")
        with self._cond:
            now = time.monotonic()
            if error is not None or resp is None:
                assert error is not None
                if error.retriable:
                    log.debug("group %s: heartbeat failed, retrying: %s", self.group, error)
                else:
                    log.info("group %s: heartbeat refused: %s", self.group, error)
                events = self._m.on_error(now, error)
            else:
                assignment = None
                if resp.HasField("assignment"):
                    assignment = [
                        TargetPartition(p.topic, p.partition, p.track or "default", p.filter or "*")
                        for p in resp.assignment.partitions
                    ]
                events = self._m.on_response(
                    now, resp.member_id, resp.member_epoch, resp.heartbeat_interval_ms, assignment
                )
            self._cond.notify_all()
        for ev in events:
            if isinstance(ev, Fatal):
                log.error("group %s: %s", self.group, ev.error)
        return events
