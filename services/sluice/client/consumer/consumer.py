"""The group consumer: a façade over the group member, the subscription state and the prefetcher.

::

    consumer = client.consumer(group="g", subscribe={"orders": "tagA || tagB"}, auto_offset_reset="earliest")
    while running:
        for record in consumer.poll(timeout=1.0):
            handle(record)
    consumer.close()          # commits, revokes, leaves the group

No thread is its own: its heartbeats run on the Client's group driver (``member.py``,
``group_driver.py``: one event loop for every member of the Client) and its fetching
on the Client's fetch driver (``prefetch.py``, ``fetch_driver.py``: one thread for every
consumer of the Client), or on ``poll()``'s thread while it waits alone on its connection
("poll() drives" there), so a Client holds a thousand consumers (docs/consumer.md).
Everything that changes what this member owns runs in ``poll()``, on the application's
thread, as in Kafka: applying a new target assignment, revoking (commit, ``on_revoke``,
then release), dropping lost partitions (``on_lost``), looking up committed offsets of
new partitions, and the auto-commit. So a revoked partition is committed only once the records the
application got from it are processed, and released only after that commit.

Use one thread for ``poll``/``commit``/``seek``/``pause``/``resume``/``close``;
``done()`` (``commit_mode="in-flight-min"``) may be called from any thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import TypeVar

from sluice.client.consumer.async_commits import CommitStats, Waiter
from sluice.client.consumer.collect import CollectingEngine
from sluice.client.consumer.config import CommitCallback
from sluice.client.consumer.engine import check_tp
from sluice.client.consumer.membership import MemberState
from sluice.client.consumer.retry import RetryOutcome, resume_due
from sluice.client.consumer.state import PartitionLifecycle
from sluice.codec.batch import Record, RecordColumns
from sluice.errors import InvalidArgument, OffsetOutOfRange, ReconsumeRefused, SluiceError

__all__ = ["CommitCallback", "Consumer", "ConsumerStats"]

log = logging.getLogger("sluice.consumer")

TopicPartition = tuple[str, int]
_L = PartitionLifecycle
_T = TypeVar("_T")
#: How long one wait of ``for record in consumer`` lasts before it checks whether the consumer closed.
_ITER_WAIT = 1.0


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """What ``consumer.stats()`` returns: a snapshot of the consumer's counters."""

    commits: CommitStats


class Consumer(CollectingEngine):
    """A member of a consumer group. Make one with ``client.consumer(...)``."""

    # ---- polling ------------------------------------------------------------------------------------

    def poll(self, timeout: float = 1.0, max_records: int | None = None) -> list[Record]:
        """Records from the assigned partitions, waiting up to ``timeout`` seconds for some.

        Returns at most ``max_records`` (default ``max_poll_records``). Applies rebalances
        (calling ``on_assign`` / ``on_revoke`` / ``on_lost``), auto-commits and runs the
        callbacks of finished asynchronous commits. Raises the typed error of a refused
        membership, of a failed fetch, of a failed ``commit_async()`` that had no callback, or
        OffsetOutOfRange for a partition without a position under ``auto_offset_reset="none"``
        (``seek()`` it). With deserializers, a record they fail on is raised alone as
        DeserializationError carrying the raw record; the next poll goes on after it.
        """
        self._check_open()
        limit = self.config.max_poll_records if max_records is None else _positive("max_records", max_records)
        deadline = time.monotonic() + max(float(timeout), 0.0)
        self._poll_started()
        if self._park is not None:  # park_poison_keys (docs/poison-keys.md, "Pull consumers")
            return self._poll_parked(self._park, limit, deadline)
        self._prefetch.columnar = False
        return self._poll_loop(self._poll_take, limit, deadline)

    def poll_columns(
        self, timeout: float = 1.0, max_records: int | None = None
    ) -> dict[TopicPartition, RecordColumns]:
        """``poll()``'s records as columns, per partition: the same records, positions, commits,
        rebalances, callbacks and errors, with no object per record (docs/consumer.md, "Records as
        columns"). Raises InvalidArgument for a consumer with deserializers, ``retry=True``,
        ``park_poison_keys`` or ``commit_mode="in-flight-min"`` (each needs a record object)."""
        self._check_open()
        self._check_columnar()
        limit = self.config.max_poll_records if max_records is None else _positive("max_records", max_records)
        deadline = time.monotonic() + max(float(timeout), 0.0)
        self._poll_started()
        self._prefetch.columnar = True  # what is fetched from now on is decoded as columns
        return self._poll_loop(self._poll_take_columns, limit, deadline)

    def _poll_loop(
        self, take: Callable[[int, float], tuple[_T, float | None]], limit: int, deadline: float
    ) -> _T:
        # This thread reads its answers itself while it waits (prefetch.py, "poll() drives"); at the
        # deadline it reads once more what waits in the socket (``last``): no other thread reads it.
        drives, last = True, False
        while True:
            self._poll_prepare()
            with self._lock:
                records, wait = take(limit, deadline)
                if records or self._closed or (wait is None and (last or not self._prefetch.in_socket)):
                    return records
                last = wait is None
                claimed = (wait is None or wait > 0) and drives and self._prefetch.claim()
                if wait is not None and wait > 0 and not claimed:
                    self._ready.wait(wait)
            if claimed:
                drives = self._prefetch.drive(wait or 0.0)

    # poll() in three steps, so sluice.aio runs the same ones (docs/asyncio.md): the blocking step
    # (rebalance work, callbacks) in a worker thread, taking records on the event loop's thread with
    # no await between taking and returning them, and the wait on an asyncio future.

    def _poll_started(self) -> None:
        """What a poll() does once at its start: report finished commits, and (poll mode) count the
        previous poll's records as processed."""
        self._report_commits()
        with self._lock:
            self._state.returned_done()

    def _poll_prepare(self) -> None:
        """The part of a poll pass that may block: retry resumes, rebalance work and its callbacks,
        the auto-commit. Returns at once when nothing changed (``_poll_may_block()`` is False)."""
        if self._retry is not None:
            resume_due(self._retry, self.paused, self.resume)
        self._reconcile()
        if self._retry is not None:
            self._retry.check_assigned(self._state, self._lock)
        self._maybe_auto_commit()

    def _poll_light(self) -> None:
        """``_poll_prepare`` when ``_poll_may_block()`` is False: only what never blocks (sluice.aio
        runs it on the event loop's thread; rebalance work that arrives meanwhile waits a pass)."""
        if self._retry is not None:
            resume_due(self._retry, self.paused, self.resume)
        self._maybe_auto_commit()

    def _poll_may_block(self) -> bool:
        """Whether ``_poll_started``/``_poll_prepare`` may block or call application callbacks now."""
        if self._retry is not None:
            with self._lock:
                if self._retry.unchecked(self._state):
                    return True
        return bool(
            self._events
            or not self._settled
            or self._fatal is not None
            or self._async.has_outcomes
            or self._commit_error is not None
        )

    def __iter__(self) -> Iterator[Record]:
        """``for record in consumer``: records one at a time as they arrive, until the consumer is
        closed (by ``close()`` from another thread, or ``break`` then ``close()``).

        Each record is taken by its own ``poll(max_records=1)`` (from the prefetch buffer, no round
        trip), so in ``poll`` commit mode a ``commit()`` inside the loop covers exactly the records
        handed out before the current one plus it, never ones the loop has not reached.
        """
        while not self._closed:
            try:
                yield from self.poll(timeout=_ITER_WAIT, max_records=1)
            except SluiceError:
                if self._closed:
                    return
                raise

    def done(self, record: Record) -> None:
        """``commit_mode="in-flight-min"``: ``record`` is processed. Any thread may call it."""
        if not self._state.in_flight_min:
            raise InvalidArgument(
                'done() needs commit_mode="in-flight-min" (in "poll" mode the next poll() is done)'
            )
        with self._lock:
            part = self._state.done((record.topic, record.partition), record.offset)
            if part is not None and part.lifecycle is _L.REVOKING and not part.in_flight:
                self._ready.notify_all()

    # ---- retry (docs/retry.md) -------------------------------------------------------------------

    def reconsume_later(
        self, record: Record, delay_level: int | None = None, delay: timedelta | None = None
    ) -> RetryOutcome:
        """Consume ``record`` again later: send it to the group's retry topic ``RETRY.<group>`` (due
        after the next delay level, or ``delay_level`` / ``delay``), or past ``max_reconsume_times`` to
        ``DLQ.<group>``, then mark it processed and commit asynchronously so its partition moves on.
        A crash in between does not write it twice (the target is checked for its source coordinates).

        Raises ReconsumeRefused for an ``orderly`` consumer, RecordNotOwned for a record poll() did not
        hand out here (or already done), DelayLevelOutOfRange, InvalidArgument without ``retry=True``.
        """
        self._check_open()
        if self.config.orderly:
            raise ReconsumeRefused(
                f"group {self.group!r}: this consumer asked for ordered processing (orderly=True); a retry "
                "would reorder its partition: retry in place (process the record again) instead"
            )
        retrier = self._retry
        if retrier is None:
            raise InvalidArgument(
                f"group {self.group!r}: reconsume_later needs client.consumer(..., retry=True)"
            )
        with self._lock:
            retrier.check_owned(self._state, record)
        outcome = retrier.send(record, delay_level, delay)
        tp = (record.topic, record.partition)
        with self._lock:
            if tp not in self._state.parts:
                return outcome  # revoked meanwhile: its next owner finds the retry and skips the source
        # A refused commit is not the application's error: the retry is written, and whoever reads the
        # original next skips it (skip_retried). Loss of membership reaches it through on_lost.
        if self._state.in_flight_min:
            self.done(record)
            self.commit_async(callback=_log_refusal)
        else:
            self.commit_async({tp: record.offset + 1}, callback=_log_refusal)
        return outcome

    # ---- rebalances (application thread, from poll) --------------------------------------------------

    # ---- commits ------------------------------------------------------------------------------------

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
        """Commit and wait. Without ``offsets``: what is processed on every partition: in
        ``poll`` mode everything poll() returned so far (call it after processing, like
        Kafka's commitSync), in ``in-flight-min`` mode up to the smallest offset not yet
        ``done()``. Returns what was committed. Raises the first refusal
        (StaleMemberEpoch, UnknownMember, NotOwner: this member no longer owns the partition).

        Asynchronous commits made before it finish first (their callbacks run here), so this
        commit is the last word.
        """
        self._check_open()
        self._before_commit()  # e.g. the records it parked are acknowledged before their offsets commit
        self._async.flush(self._timeout)
        self._report_commits()
        with self._lock:
            if offsets is None:
                self._state.returned_done()  # poll mode: called after processing, like commitSync
                todo = self._state.to_commit()
            else:
                todo = self._explicit(offsets)
        result = self._commit_sync(todo)
        errors = [e for e in result.values() if e is not None]
        if errors:
            raise errors[0]
        return {tp: off for tp, (off, _) in todo.items()}

    def commit_async(
        self, offsets: Mapping[TopicPartition, int] | None = None, callback: CommitCallback | None = None
    ) -> None:
        """Commit without waiting: ``offsets``, or (None) what is processed, as ``commit()``.

        Calls coalesce (the latest offset of each partition wins), at most
        ``max_in_flight_commits`` commits travel at once, and retriable errors are retried with
        backoff for up to ``request_timeout``. ``callback(offsets, error)`` (else ``on_commit``)
        gets the outcome on the application's thread, in the next ``poll()`` / ``commit()`` /
        ``commit_async()`` / ``close()``; ``offsets`` are those of the commit that carried this
        call's. Without either, a failure (a fenced member's StaleMemberEpoch, UnknownMember,
        NotOwner; RequestTimedOut after the retries, or CommitOutcomeUnknown when an attempt may have
        been stored) is raised by the next ``poll()`` /
        ``commit()`` / ``commit_async()``. See docs/consumer.md.
        """
        self._check_open()
        self._before_commit()
        self._report_commits()
        with self._lock:
            if offsets is None:
                self._state.returned_done()
                todo = self._state.to_commit()
            else:
                todo = self._explicit(offsets)
        self._async.submit(todo, Waiter(callback))

    def stats(self) -> ConsumerStats:
        """Counters of this consumer (the asynchronous commits and auto-commits)."""
        return ConsumerStats(commits=self._async.stats())

    # ---- positions ------------------------------------------------------------------------------------

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make the next ``poll()`` return ``tp``'s records from ``offset`` on. Commits stay
        increase-only: seeking back re-reads, and commits below the committed offset are ignored."""
        self._check_open()
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise OffsetOutOfRange(f"seek offset must be an integer >= 0, got {offset!r}")
        with self._lock:
            part = self._owned(tp)
            self._state.seek(part, offset)
            self._offsets.leader_epochs.pop(part.tp, None)  # a chosen offset: no epoch to check it by
            if part.lifecycle is _L.FETCHING:
                self._prefetch.fetch_from(part.tp, offset, part.fetch_epoch, part.filter)

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the next record ``poll()`` returns from ``tp`` (None: not known yet)."""
        with self._lock:
            part = self._owned(tp)
            return part.position if part.position >= 0 else None

    def highwater(self, tp: TopicPartition) -> int | None:
        """``tp``'s high watermark as of the last fetch answer for it (None: no answer since it was
        assigned or resumed); ``highwater(tp) - position(tp)`` is the lag without a request."""
        with self._lock:
            return self._prefetch.highwater(self._owned(tp).tp)

    def committed(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, int | None]:
        """Committed offsets from the offset store (None: nothing committed), on each
        partition's track (``default`` for partitions not assigned here)."""
        self._check_open()
        with self._lock:
            tps = sorted(self._state.parts) if partitions is None else [check_tp(tp) for tp in partitions]
            tracks = {
                tp: (self._state.parts[tp].track if tp in self._state.parts else "default") for tp in tps
            }
        found = self._offsets.fetch(tracks, self._member.member_id)
        return {tp: (off if off >= 0 else None) for tp, off in found.items()}

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this member holds (not counting ones being revoked)."""
        with self._lock:
            return frozenset(tp for tp, p in self._state.parts.items() if p.lifecycle is not _L.REVOKING)

    def tracks(self) -> dict[TopicPartition, str]:
        """The offset track of each held partition (``default`` unless the group splits filters)."""
        with self._lock:
            return {tp: p.track for tp, p in self._state.parts.items()}

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching ``partitions``; buffered records of theirs are dropped (re-fetched on resume)."""
        with self._lock:
            for tp in partitions:
                part = self._owned(tp)
                if part.lifecycle is not _L.PAUSED:
                    self._state.pause(part)
                    self._prefetch.stop_fetching(part.tp)

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                part = self._owned(tp)
                if part.lifecycle is _L.PAUSED:
                    self._state.resume(part)
                    self._settled = False
                    if part.position >= 0:
                        self._prefetch.fetch_from(part.tp, part.position, part.fetch_epoch, part.filter)

    def paused(self) -> frozenset[TopicPartition]:
        with self._lock:
            return frozenset(tp for tp, p in self._state.parts.items() if p.lifecycle is _L.PAUSED)

    @property
    def member_id(self) -> str:
        return self._member.member_id

    @property
    def member_epoch(self) -> int:
        return self._member.member_epoch

    # ---- lifecycle ------------------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Make a final synchronous commit of what is processed, call on_revoke, leave the group
        (a static member leaves temporarily, keeping its partitions for the session timeout) and
        stop. Idempotent.

        Asynchronous commits still travelling finish first (up to ``timeout``, default
        ``request_timeout``; what is left then fails with RequestTimedOut), so none of them lands
        after the final commit. Their callbacks run here; the final commit's outcome goes to
        ``on_commit`` (a failure is also logged: close() does not raise it, so that it never
        hides the application's own exception in a ``with`` block or ``finally``).
        """
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._ready.notify_all()  # a poll() or iterator waiting in another thread (or task) returns
        wait = self._timeout if timeout is None else max(float(timeout), 0.0)
        try:
            if self._park is not None:
                self._park.settle()  # before leaving: the next owner's replay sees the heads processed
            self._async.close(wait)
            # Their callbacks run before the final commit; one raising does not skip it (raised last).
            callback_error = self._report_commits(closing=True)
            if self._member.state is MemberState.STABLE and self._fatal is None:
                with self._lock:
                    self._state.returned_done()  # poll mode: what the last poll returned is processed
                    todo = self._state.to_commit()
                    held = sorted(self._state.parts)
                self._final_commit(todo)
                self._callback("on_revoke", held)
            if callback_error is not None:
                raise callback_error
        finally:
            self._shutdown(leave=True)
            if self._retry is not None:
                self._retry.close()
            if self._park is not None:
                self._park.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        m = self._member
        return f"<Consumer group={self.group!r} member={m.member_id!r} epoch={m.member_epoch}>"


def _log_refusal(offsets: dict[TopicPartition, int], error: SluiceError | None) -> None:
    if error is not None:
        log.info("commit after reconsume_later refused (%s): the next reader skips the retried record", error)


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name} must be an integer >= 1, got {value!r}")
    return value
