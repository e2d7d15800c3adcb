"""What runs under the group consumer's façade (``consumer.py``): its parts and their bookkeeping.

``ConsumerEngine`` builds the parts (the fetcher and prefetcher, the offset store client, the
group member, the async committer) and holds the work ``poll()`` does on the application's
thread: applying a new target assignment, revoking (commit, ``on_revoke``, release), dropping
lost partitions, looking up committed offsets of new partitions, the commit bookkeeping
(synchronous commits, restarts after a re-created or deleted topic, the auto-commit) and the
shutdown. ``Consumer`` (``consumer.py``) adds the public API on top; see its docstring.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Self

from sluice.client.consumer.async_commits import AsyncCommitter, Waiter
from sluice.client.consumer.commits import CommitResult, OffsetStoreClient
from sluice.client.consumer.config import ConsumerConfig, subscription_of
from sluice.client.consumer.fetch_driver import FetchDriver
from sluice.client.consumer.group_driver import GroupDriver
from sluice.client.consumer.member import GroupMember
from sluice.client.consumer.membership import Event, Fatal, Lost, MemberState, NewTarget
from sluice.client.consumer.prefetch import Prefetcher
from sluice.client.consumer.retry import Retrier
from sluice.client.consumer.state import Assignment, PartitionLifecycle, PartitionState, SubscriptionState
from sluice.client.fetcher import Fetcher
from sluice.client.links import BrokerLinks
from sluice.client.memory import ClientMemory
from sluice.client.metadata import MetadataCache
from sluice.client.wakers import WakeableCondition
from sluice.common.peers import Peers
from sluice.errors import (
    InvalidArgument,
    OffsetOutOfRange,
    SluiceError,
    StaleMemberEpoch,
    UnknownTopicId,
    UnknownTopicOrPartition,
)
from sluice.serde.records import RecordDeserializer

__all__ = ["ConsumerEngine", "TopicPartition", "check_tp"]

log = logging.getLogger("sluice.consumer")

TopicPartition = tuple[str, int]
_L = PartitionLifecycle


class ConsumerEngine:
    """The parts of a group consumer and the rebalance and commit work of ``poll()``."""

    def __init__(
        self,
        channels: Peers,
        metadata: MetadataCache,
        group: str,
        subscription: Mapping[str, str],
        config: ConsumerConfig,
        client_id: str,
        on_close: Callable[[Self], None] | None = None,
        links: BrokerLinks | None = None,
        group_driver: GroupDriver | None = None,
        fetch_driver: FetchDriver | None = None,
        memory: ClientMemory | None = None,
    ) -> None:
        self.group = group
        self.subscription = dict(subscription)
        self.config = config
        #: key_deserializer / value_deserializer (docs/serializers.md), applied as poll() hands records out.
        self._deserialize = RecordDeserializer.of(config.key_deserializer, config.value_deserializer)
        self._on_close = on_close
        self._lock = threading.RLock()
        #: Notified when poll() has something to do; sluice.aio waits on it through a waker.
        self._ready = WakeableCondition(self._lock)
        self._state = SubscriptionState(in_flight_min=config.commit_mode == "in-flight-min")
        self._events: list[Event] = []
        self._fatal: SluiceError | None = None
        #: False while rebalance work may be pending (events, revocations, positions to look up).
        self._settled = False
        self._closed = False
        self._timeout = config.request_timeout.total_seconds()
        #: ``retry=True``: the retry side (set by ``client.consumer``, which has the producer; docs/retry.md).
        self._retry: Retrier | None = None
        fetcher = Fetcher(
            channels,
            metadata,
            {},
            max_wait_ms=config.fetch_max_wait_ms,
            min_bytes=config.fetch_min_bytes,
            max_bytes=config.fetch_max_bytes,
            partition_max_bytes=config.partition_max_bytes,
            auto_offset_reset=config.auto_offset_reset,  # type: ignore[arg-type]
            client_id=client_id,
            request_timeout=self._timeout,
            check_crcs=config.check_crcs,
            links=links,
        )
        #: The Client's drivers serve every consumer of the Client; a consumer made alone has its own.
        self._own_fetch_driver = fetch_driver is None
        self._fetch_driver = fetch_driver if fetch_driver is not None else FetchDriver()
        self._prefetch = Prefetcher(
            fetcher,
            config.buffer_max_bytes,
            self._lock,
            self._ready,
            self._fetch_driver,
            check_crcs=config.check_crcs,
            memory=memory,
        )
        self._offsets = OffsetStoreClient(
            channels, metadata, group, subscription, self._timeout, config.message_model == "broadcasting"
        )
        self._own_driver = group_driver is None
        self._driver = (
            group_driver
            if group_driver is not None
            else GroupDriver(metadata.bootstrap, security=channels.security)
        )
        self._member = GroupMember(
            self._driver, metadata, group, subscription, config, client_id, self._on_events
        )
        self._async = AsyncCommitter(
            self._offsets,
            self._member,
            self._holds,
            self._stored,
            self._restart_recreated,
            config.max_in_flight_commits,
            self._timeout,
        )
        #: A failed commit_async() that had no callback (nor on_commit): raised by the next call.
        self._commit_error: SluiceError | None = None
        self._interval = config.auto_commit_interval.total_seconds()
        self._next_auto_commit = time.monotonic() + self._interval
        self._prefetch.start()
        self._member.start()
        try:
            # Joining synchronously makes a refused subscription (INCONSISTENT_SUBSCRIPTION,
            # an unknown topic or assignor) an error of client.consumer(...) itself.
            self._member.wait_first_answer(self._timeout)
        except BaseException:
            self._shutdown(leave=True)
            raise

    def _on_events(self, events: list[Event]) -> None:
        """Caller: the group driver's loop. Queue the events for the next poll and wake it."""
        with self._lock:
            self._events.extend(events)
            self._ready.notify_all()

    def _reconcile(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if not self._events and self._settled:
            return  # the common case, once per poll: nothing changed since the last pass
        with self._lock:
            events, self._events = self._events, []
            self._settled = False
        for ev in events:
            if isinstance(ev, Fatal):
                self._fatal = ev.error
            elif isinstance(ev, Lost):
                self._lose_all(ev.error)
            elif isinstance(ev, NewTarget):
                self._apply_target(ev)
        self._finish_revocations()
        self._add_assigned()
        self._resolve_positions()
        if self._fatal is not None:
            raise self._fatal
        with self._lock:
            # Settled: every partition fetches (or is paused) and nothing waits for a revocation.
            self._settled = not self._events and all(
                p.lifecycle is _L.FETCHING or p.lifecycle is _L.PAUSED for p in self._state.parts.values()
            )

    def _apply_target(self, ev: NewTarget) -> None:
        with self._lock:
            self._state.replace_assignment(Assignment(ev.epoch, ev.partitions))
            for tp, part in self._state.parts.items():
                target = ev.partitions.get(tp)
                if target is not None and (target.track, target.filter) == (part.track, part.filter):
                    continue
                if part.lifecycle is not _L.REVOKING:
                    self._state.begin_revoke(part)
                    self._prefetch.stop_fetching(tp)
        log.info("group %s: target assignment at epoch %d: %s", self.group, ev.epoch, sorted(ev.partitions))

    def _revocations_ready(self) -> bool:
        return any(p.lifecycle is _L.REVOKING and not p.in_flight for p in self._state.parts.values())

    def _finish_revocations(self) -> None:
        """Commit, call on_revoke and release every revoked partition with nothing in flight."""
        with self._lock:
            ready = sorted(
                tp for tp, p in self._state.parts.items() if p.lifecycle is _L.REVOKING and not p.in_flight
            )
            offsets = self._state.to_commit(ready)
        if not ready:
            return
        # Async commits still travelling finish first: none reaches the store after the release.
        self._async.flush(self._timeout)
        try:
            self._commit_sync(offsets)
        except SluiceError as exc:
            # A zombie's commit is refused (its Lost event follows); anything else means the
            # next owner re-reads from the last commit: duplicates, never a loss.
            log.warning("group %s: commit before revoking %s failed: %s", self.group, ready, exc)
        try:
            self._callback("on_revoke", ready)
        finally:
            with self._lock:
                for tp in ready:
                    self._state.remove(tp)
            self._member.released(frozenset(ready))

    def _add_assigned(self) -> None:
        """Take on the target's partitions that are not held yet (once revocations are done)."""
        with self._lock:
            added = [
                target
                for tp, target in self._state.assignment.partitions.items()
                if tp not in self._state.parts
            ]
            for target in added:
                self._state.add(target)
            owned = self._state.owned()
        if not added:
            return
        self._member.set_owned(owned)
        self._callback("on_assign", sorted(t.tp for t in added))

    def _resolve_positions(self) -> None:
        """Look up the committed offsets of partitions without a position (auto_offset_reset if none)."""
        with self._lock:
            todo = {
                tp: p.track
                for tp, p in self._state.parts.items()
                if p.lifecycle is _L.AWAITING_POSITION and p.position_error is None
            }
        if todo:
            committed = self._offsets.fetch(todo, self._member.member_id)
            resets = self._offsets.reset_positions(
                [tp for tp, off in committed.items() if off < 0], self.config.auto_offset_reset
            )
            with self._lock:
                for tp in todo:
                    part = self._state.parts.get(tp)
                    if part is None or part.lifecycle is not _L.AWAITING_POSITION:
                        continue  # revoked, lost or seeked meanwhile
                    leader_epoch = -1
                    if committed[tp] >= 0:
                        self._state.start(part, committed[tp], committed[tp])
                        leader_epoch = self._offsets.leader_epochs.get(tp, -1)
                    elif tp in resets:
                        # Committed at the next commit, so a later owner starts from the same place.
                        self._state.start(part, resets[tp], -1)
                    else:
                        part.position_error = OffsetOutOfRange(
                            f"{tp[0]}[{tp[1]}]: group {self.group} has no committed offset on track "
                            f"{part.track!r} and auto_offset_reset is 'none'; seek() to choose a position",
                            topic=tp[0],
                            partition=tp[1],
                        )
                        continue
                    self._prefetch.fetch_from(tp, part.position, part.fetch_epoch, part.filter, leader_epoch)
        with self._lock:
            for part in self._state.parts.values():
                if part.position_error is not None and part.lifecycle is _L.AWAITING_POSITION:
                    raise part.position_error

    def _lose_all(self, error: SluiceError) -> None:
        """Fenced or forgotten: drop every partition without committing, then rejoin."""
        with self._lock:
            lost = sorted(self._state.parts)
            for tp in lost:
                self._prefetch.stop_fetching(tp)
            self._state.parts.clear()
            self._state.replace_assignment(Assignment())
        self._async.fail_unsent(error)
        log.warning(
            "group %s: membership lost (%s); partitions %s dropped uncommitted", self.group, error, lost
        )
        try:
            if lost:
                self._callback("on_lost", lost)
        finally:
            self._member.lost_handled()

    def _callback(self, name: str, partitions: list[TopicPartition]) -> None:
        fn = self.config.callback(name)
        if fn is not None and partitions:
            fn(partitions)

    def _explicit(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, tuple[int, str]]:
        """Checked explicit offsets as {tp: (offset, track)} (the caller holds the lock)."""
        todo = {}
        for tp, off in offsets.items():
            part = self._owned(tp)
            if isinstance(off, bool) or not isinstance(off, int) or off < 0:
                raise OffsetOutOfRange(f"{tp[0]}[{tp[1]}]: offset must be an integer >= 0, got {off!r}")
            todo[tp] = (off, part.track)
        return todo

    def _report_commits(self, closing: bool = False) -> BaseException | None:
        """Hand finished asynchronous commits to their callbacks (application thread), one at a
        time, so an exception in one leaves the rest queued. Then raise a failed commit_async()
        that nobody was told of (once). ``closing``: deliver everything whatever the callbacks
        raise, and return (not raise) the first exception."""
        first: BaseException | None = None
        while self._async.has_outcomes:
            outcome = self._async.next_outcome()
            if outcome is None:
                break
            fn = outcome.waiter.callback or self.config.on_commit
            if fn is not None:
                try:
                    fn(outcome.offsets, outcome.error)
                except Exception as exc:
                    if not closing:
                        raise
                    first = first or exc
            elif outcome.error is not None and outcome.waiter.auto:
                # Counted in stats().commits.auto_failed; the next auto-commit tries again.
                log.warning("group %s: auto-commit failed: %s", self.group, outcome.error)
            elif outcome.error is not None and self._commit_error is None:
                self._commit_error = outcome.error
        error, self._commit_error = self._commit_error, None
        if error is not None and closing:
            log.warning("group %s: commit_async failed (no callback, closing): %s", self.group, error)
        elif error is not None:
            raise error
        return first

    def _holds(self, tp: TopicPartition) -> bool:
        """Caller: the AsyncCommitter. Whether ``tp`` is still this member's (revoking counts)."""
        with self._lock:
            return tp in self._state.parts

    def _stored(self, offsets: dict[TopicPartition, int]) -> None:
        """Caller: the AsyncCommitter (gRPC's thread), after the store accepted ``offsets``."""
        with self._lock:
            for tp, off in offsets.items():
                self._state.committed_ok(tp, off)

    def _commit_sync(self, todo: dict[TopicPartition, tuple[int, str]]) -> CommitResult:
        """Commit under the current epoch; a STALE_MEMBER_EPOCH (the coordinator moved the epoch
        on while the commit travelled) is retried after the next heartbeat answer."""
        self._before_commit()
        result: CommitResult = {}
        pending = dict(todo)
        for attempt in range(3):
            if not pending:
                break
            answered = self._member.answered
            epoch = self._member.member_epoch
            got = self._offsets.commit(self._offsets.request(self._member.member_id, epoch, pending))
            with self._lock:
                for tp, err in got.items():
                    result[tp] = err
                    if err is None:
                        self._state.committed_ok(tp, pending[tp][0])
            self._restart_recreated(got)
            stale = {tp for tp, err in got.items() if isinstance(err, StaleMemberEpoch)}
            if not stale or attempt == 2 or self._member.state is not MemberState.STABLE:
                break
            self._member.heartbeat_now()
            self._member.wait_answer_after(answered, min(self._timeout, 5.0))
            if self._member.member_epoch == epoch:
                break
            pending = {tp: pending[tp] for tp in stale}
        return result

    def _restart_recreated(self, result: CommitResult) -> None:
        """A commit refused with UnknownTopicId: the partition's topic was deleted and re-created since
        its position was looked up, so that position is the old topic's. Look it up again on the new
        topic (nothing committed there: ``auto_offset_reset``), so none of the new topic's records is
        skipped; records read at the old position meanwhile come again (at least once)."""
        self._restart(tp for tp, err in result.items() if isinstance(err, UnknownTopicId))

    def _restart_vanished(self, error: SluiceError) -> None:
        """A fetch found no topic under a partition (deleted; maybe re-created by now). Its position is
        looked up again, so a re-created topic is read from its own committed offset (none: from
        ``auto_offset_reset``) rather than from the old topic's position; while no topic has the name
        the lookup keeps failing with UnknownTopicOrPartition, until the group revokes the partition."""
        topic, partition = error.fields.get("topic"), error.fields.get("partition")
        if (
            isinstance(error, UnknownTopicOrPartition)
            and isinstance(topic, str)
            and isinstance(partition, int)
        ):
            self._restart([(topic, partition)])

    def _restart(self, tps: Iterable[TopicPartition]) -> None:
        gone = sorted(tps)
        if not gone:
            return
        with self._lock:
            for tp in gone:
                part = self._state.parts.get(tp)
                if part is not None and part.lifecycle is not _L.REVOKING and part.position >= 0:
                    self._prefetch.stop_fetching(tp)
                    self._state.restart(part)
            self._settled = False
            self._ready.notify_all()
        log.warning(
            "group %s: the topic of %s was deleted or re-created; positions looked up again", self.group, gone
        )

    def _maybe_auto_commit(self) -> None:
        if not self.config.enable_auto_commit:
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self._interval
        if self._member.state is not MemberState.STABLE:
            return
        with self._lock:
            todo = self._state.to_commit()
        if todo:
            self._before_commit()
            # Coalesces with commits still travelling; its outcome goes to on_commit.
            self._async.submit(todo, Waiter(None, auto=True))

    def _before_commit(self) -> None:
        """What must be durable before any offset is committed: every commit path calls it first (the
        parking store's writes, ``ParkingEngine``)."""

    def _owned(self, tp: TopicPartition) -> PartitionState:
        part = self._state.parts.get(check_tp(tp))
        if part is None or part.lifecycle is _L.REVOKING:
            raise InvalidArgument(f"{tp[0]}[{tp[1]}] is not assigned to this consumer (group {self.group})")
        return part

    def _final_commit(self, todo: dict[TopicPartition, tuple[int, str]]) -> None:
        if not todo:
            return
        error: SluiceError | None
        try:
            error = next((e for e in self._commit_sync(todo).values() if e is not None), None)
        except SluiceError as exc:
            error = exc
        if error is not None:
            log.warning("group %s: commit on close failed: %s", self.group, error)
        if self.config.on_commit is not None:
            self.config.on_commit({tp: off for tp, (off, _) in todo.items()}, error)

    def _shutdown(self: Self, leave: bool) -> None:
        self._closed = True
        try:
            self._member.close(leave=leave)
        finally:
            # A fetch step running on the driver ends at its next check; close() does not wait.
            self._prefetch.close(0.2)
            if self._own_driver:
                self._driver.close()
            if self._own_fetch_driver:
                self._fetch_driver.close()
            if self._on_close is not None:
                self._on_close(self)

    # The one public method here (consumer.py is at its size limit): it belongs with the subscription.
    def subscribe(self, topics: Mapping[str, str] | Iterable[str] | str) -> None:
        """Replace the subscription, as ``client.consumer(group, subscribe)`` takes it (topics, or topics
        to filters; checked the same way). Returns once the coordinator took it; the next ``poll()`` calls
        revoke the partitions of topics left out (commit, ``on_revoke``) and assign the new ones."""
        self._check_open()
        subscription = subscription_of(topics)
        if self._retry is not None:  # the group's retry topic stays subscribed (docs/retry.md)
            subscription[self._retry.topic] = "*"
        self._member.resubscribe(subscription, self._timeout)
        self.subscription = subscription

    def _check_open(self) -> None:
        if self._closed:
            raise SluiceError("the consumer is closed")


def check_tp(tp: TopicPartition) -> TopicPartition:
    if not (isinstance(tp, tuple) and len(tp) == 2 and isinstance(tp[0], str) and isinstance(tp[1], int)):
        raise InvalidArgument(f"a partition is a (topic, partition) tuple, got {tp!r}")
    return tp
