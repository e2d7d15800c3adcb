"""Asynchronous commits that hold under load: coalesced, bounded, retried, every outcome reported.

``commit_async()`` and the auto-commit hand their offsets to an :class:`AsyncCommitter`:

* **Coalesced.** Offsets wait in one *pending* commit until a slot is free; a later call
  merges into it and the latest offset of each partition wins. However fast the
  application calls, the pending commit holds at most one entry per partition.
* **Bounded.** At most ``max_in_flight`` commits are taken out of pending and not yet
  finished (on the wire, or waiting to be retried). With the default of 1, the one commit in
  flight carries everything processed while the previous one travelled, so the commit rate is
  one per round trip whatever the call rate, commits finish in call order, and callbacks run in
  call order.
* **Retried.** A retriable error (the store unreachable or restarting, a timeout) is retried
  with backoff (50 ms doubling to 1 s) until ``timeout`` after the commit was first sent; a
  retry also carries whatever was coalesced meanwhile. A STALE_MEMBER_EPOCH is retried (at
  most three times) only while this member is still the same member, STABLE and holding the
  partition: the epoch moved on under a rebalance that kept the partition here. Anything else
  (a fenced or forgotten member, NOT_OWNER) is final.
* **Reported.** Every call gets exactly one :class:`Outcome`: the offsets of the commit
  that carried its offsets and the first error (None: all stored). Outcomes are queued;
  the consumer hands them to callbacks on the application's thread.

Threads: a commit is sent from whichever thread frees its slot or fills it: the application's
(``submit`` with a slot free), gRPC's (the answer to the commit before it) or a retry timer's.
None of them waits for a worker thread to wake up, which on a busy two-core machine cost more
than the round trip itself. Outcomes are queued; the consumer hands them to callbacks on the
application's thread. Nothing here holds this module's lock while it calls out (``holds``,
``on_stored``, the store); the caller must not hold its own lock around :meth:`flush` or
:meth:`close` (they wait for gRPC's thread, which takes it in ``on_stored``), and the Consumer
calls :meth:`submit` outside its lock too.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sluice.client.consumer.commits import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    CommitResult,
    OffsetStoreClient,
    gave_up,
    in_doubt,
)
from sluice.client.consumer.config import CommitCallback
from sluice.client.consumer.membership import MemberState
from sluice.common.backoff import Backoff
from sluice.errors import BrokerNotAvailable, RequestTimedOut, SluiceError, StaleMemberEpoch, UnknownMember

__all__ = ["AsyncCommitter", "CommitStats", "Outcome", "Waiter"]

log = logging.getLogger("sluice.consumer")

TopicPartition = tuple[str, int]
#: How often a STALE_MEMBER_EPOCH is retried (after the heartbeat that brings the new epoch).
_STALE_RETRIES = 3
#: The shortest RPC timeout of a retry near the end of its budget.
_MIN_ATTEMPT = 0.2


class Member(Protocol):
    """What the committer reads of the group member (``GroupMember``)."""

    @property
    def member_id(self) -> str: ...

    @property
    def member_epoch(self) -> int: ...

    @property
    def state(self) -> MemberState: ...

    def heartbeat_now(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Waiter:
    """One commit request of the application (``callback`` may be None) or of the auto-commit."""

    callback: CommitCallback | None
    auto: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    waiter: Waiter
    offsets: dict[TopicPartition, int]
    error: SluiceError | None


@dataclass(frozen=True, slots=True)
class CommitStats:
    """Counters of the consumer's asynchronous commits (``consumer.stats().commits``)."""

    #: ``commit_async()`` calls.
    requested: int
    #: Auto-commits started (each is one asynchronous commit).
    auto_requested: int
    #: Calls folded into a commit that was already pending (not a request of their own).
    coalesced: int
    #: CommitOffsets requests sent, retries included.
    sent: int
    retries: int
    #: Calls (explicit or auto) whose offsets were all stored.
    succeeded: int
    #: Calls (explicit or auto) that ended with an error.
    failed: int
    #: Auto-commits that ended with an error (also in ``failed``).
    auto_failed: int
    #: Commits taken out of pending and not finished now (on the wire or waiting to retry).
    in_flight: int
    #: The most commits ever in flight at once (never above ``max_in_flight_commits``).
    max_in_flight: int
    last_error: str | None


@dataclass(eq=False)
class _Batch:
    """One commit: the offsets to send next, every offset it carried, and who waits for it."""

    to_send: dict[TopicPartition, tuple[int, str]]
    carried: dict[TopicPartition, int] = field(default_factory=dict)
    waiters: list[Waiter] = field(default_factory=list)
    errors: dict[TopicPartition, SluiceError] = field(default_factory=dict)
    #: The retry budget's end, set at the first send.
    deadline: float = 0.0
    backoff: Backoff = field(default_factory=lambda: Backoff(BACKOFF_FIRST, BACKOFF_MAX))
    due: float = 0.0
    stale_retries: int = 0
    #: Who sent the last attempt: a retry goes out only for the same member.
    member_id: str = ""
    epoch: int = -1
    refresh: bool = False
    #: An attempt may have been stored (COMMIT_OUTCOME_UNKNOWN, or no answer in time): out of retries,
    #: the outcome is CommitOutcomeUnknown, not a timeout.
    in_doubt: bool = False
    holds_slot: bool = False
    done: bool = False

    def merge(self, offsets: dict[TopicPartition, tuple[int, str]], waiters: list[Waiter]) -> None:
        self.to_send.update(offsets)
        self.carried.update({tp: off for tp, (off, _) in offsets.items()})
        self.waiters.extend(waiters)


@dataclass
class _Counters:
    requested: int = 0
    auto_requested: int = 0
    coalesced: int = 0
    sent: int = 0
    retries: int = 0
    succeeded: int = 0
    failed: int = 0
    auto_failed: int = 0
    max_in_flight: int = 0
    last_error: str | None = None


class AsyncCommitter:
    def __init__(
        self,
        store: OffsetStoreClient,
        member: Member,
        holds: Callable[[TopicPartition], bool],
        on_stored: Callable[[dict[TopicPartition, int]], None],
        on_refused: Callable[[CommitResult], None],
        max_in_flight: int,
        timeout: float,
    ) -> None:
        self._store = store
        self._member = member
        self._holds = holds
        self._on_stored = on_stored
        #: Told of every answer with refused partitions: the Consumer looks up again the position of
        #: a partition whose topic was re-created (UnknownTopicId), as after a sync commit.
        self._on_refused = on_refused
        self._max = max_in_flight
        self._timeout = timeout
        self._cond = threading.Condition()
        self._pending: _Batch | None = None
        #: Batches holding a slot: on the wire, or waiting for their retry timer.
        self._active: list[_Batch] = []
        self._timers: dict[_Batch, threading.Timer] = {}
        self._outcomes: deque[Outcome] = deque()
        self._stopped = False
        self._n = _Counters()

    # ---- the application's side (Caller: Consumer) -------------------------------------------------

    def submit(self, offsets: dict[TopicPartition, tuple[int, str]], waiter: Waiter) -> None:
        """Queue ``offsets`` ({tp: (offset, track)}); ``waiter`` gets one outcome later. Sends
        at once (on this thread) when a slot is free."""
        with self._cond:
            if self._stopped:
                raise SluiceError("the consumer is closed")
            if waiter.auto:
                self._n.auto_requested += 1
            else:
                self._n.requested += 1
            if self._pending is None:
                self._pending = _Batch({})
            else:
                self._n.coalesced += 1
            self._pending.merge(offsets, [waiter])
        self._pump()

    def flush(self, timeout: float) -> bool:
        """Wait until every submitted commit finished (False: ``timeout`` passed first)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending is not None or self._active:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def fail_unsent(self, error: SluiceError) -> None:
        """This member lost its partitions: what is not on the wire fails with ``error`` (the
        offsets were processed under a membership that is gone; they are never sent under the next)."""
        with self._cond:
            batches = [] if self._pending is None else [self._pending]
            batches += list(self._timers)
            self._pending = None
        for b in batches:
            self._finish(b, error)

    def next_outcome(self) -> Outcome | None:
        with self._cond:
            return self._outcomes.popleft() if self._outcomes else None

    @property
    def has_outcomes(self) -> bool:
        return bool(self._outcomes)

    def close(self, timeout: float) -> None:
        """Flush up to ``timeout``, then fail what is left (RequestTimedOut) and send nothing more.
        Every waiter has its outcome queued when this returns."""
        self.flush(timeout)
        with self._cond:
            self._stopped = True
            left = ([] if self._pending is None else [self._pending]) + list(self._active)
            self._pending = None
        closed = RequestTimedOut(f"the consumer closed before this commit was stored (waited {timeout:g} s)")
        for b in left:
            self._finish(b, closed)

    def stats(self) -> CommitStats:
        with self._cond:
            n = self._n
            return CommitStats(
                requested=n.requested,
                auto_requested=n.auto_requested,
                coalesced=n.coalesced,
                sent=n.sent,
                retries=n.retries,
                succeeded=n.succeeded,
                failed=n.failed,
                auto_failed=n.auto_failed,
                in_flight=len(self._active),
                max_in_flight=n.max_in_flight,
                last_error=n.last_error,
            )

    # ---- the pipeline (any of the threads above) --------------------------------------------------

    def _pump(self) -> None:
        """Send the pending commit if a slot is free."""
        with self._cond:
            if self._stopped or self._pending is None or len(self._active) >= self._max:
                return
            batch, self._pending = self._pending, None
            batch.holds_slot = True
            self._active.append(batch)
            self._n.max_in_flight = max(self._n.max_in_flight, len(self._active))
        self._guarded(self._send, batch)

    def _retry_due(self, batch: _Batch) -> None:
        """Caller: the batch's retry timer. The retry carries what was coalesced meanwhile."""
        with self._cond:
            if self._timers.pop(batch, None) is None or batch.done or self._stopped:
                return
            if self._pending is not None:
                p, self._pending = self._pending, None
                self._n.coalesced += 1  # its first call, the one that had a request of its own to come
                batch.merge(p.to_send, p.waiters)
        self._guarded(self._send, batch)

    def _guarded(self, step: Callable[[_Batch], None], batch: _Batch) -> None:
        try:
            step(batch)
        except Exception as exc:  # never lose a commit silently on a client bug: it fails instead
            log.exception("async commit failed in the client")
            self._finish(batch, SluiceError(f"commit failed in the client: {exc!r}"))

    def _send(self, batch: _Batch) -> None:
        if batch.done:
            return  # finished by close() meanwhile
        if not batch.to_send:
            self._finish(batch)  # nothing new to commit: done once everything before it is
            return
        member_id, epoch = self._member.member_id, self._member.member_epoch
        if batch.member_id and member_id != batch.member_id:
            self._finish(
                batch,
                UnknownMember(
                    f"member {batch.member_id!r} lost its membership before its commit could be retried"
                ),
            )
            return
        now = time.monotonic()
        if not batch.deadline:
            batch.deadline = now + self._timeout
        batch.member_id, batch.epoch = member_id, epoch
        request = self._store.request(member_id, epoch, batch.to_send)
        with self._cond:
            self._n.sent += 1
        self._store.commit_async(
            request,
            functools.partial(self._answered, batch),
            refresh=batch.refresh,
            timeout=max(batch.deadline - now, _MIN_ATTEMPT),
        )

    def _answered(self, batch: _Batch, answer: CommitResult | SluiceError) -> None:
        """Caller: gRPC's thread (or ``_send``'s, when no stub could be had)."""
        self._guarded(functools.partial(self._handle, answer=answer), batch)

    def _handle(self, batch: _Batch, answer: CommitResult | SluiceError) -> None:
        if batch.done:
            return  # finished by close() while on the wire
        if isinstance(answer, SluiceError):
            retry = self._failed_whole(batch, answer)
        else:
            retry = self._answered_per_partition(batch, answer)
        if not retry:
            self._finish(batch)
            return
        self._schedule_retry(batch, retry)

    def _failed_whole(self, batch: _Batch, error: SluiceError) -> dict[TopicPartition, tuple[int, str]]:
        """The request as a whole failed: every partition of it carries the error; returns what to retry."""
        for tp in batch.to_send:
            batch.errors[tp] = error
        batch.refresh = isinstance(error, BrokerNotAvailable)
        batch.in_doubt = batch.in_doubt or in_doubt(error)
        return dict(batch.to_send) if self._may_retry(batch, error, None) else {}

    def _answered_per_partition(
        self, batch: _Batch, answer: CommitResult
    ) -> dict[TopicPartition, tuple[int, str]]:
        """Records what was stored and what was refused; returns the refusals worth retrying."""
        retry: dict[TopicPartition, tuple[int, str]] = {}
        stored: dict[TopicPartition, int] = {}
        refused: CommitResult = {}
        for tp, err in answer.items():
            sent = batch.to_send.get(tp)
            if sent is None:
                continue
            if err is None:
                stored[tp] = sent[0]
                batch.errors.pop(tp, None)
                continue
            batch.errors[tp] = err
            refused[tp] = err
            if self._may_retry(batch, err, tp):
                retry[tp] = sent
        if stored:
            self._on_stored(stored)
        if refused:
            self._on_refused(refused)
        return retry

    def _schedule_retry(self, batch: _Batch, retry: dict[TopicPartition, tuple[int, str]]) -> None:
        now = time.monotonic()
        if now >= batch.deadline:
            last = next(iter(batch.errors.values()))
            self._finish(batch, gave_up(self._timeout, last, batch.in_doubt))
            return
        delay = batch.backoff.next()
        if any(isinstance(batch.errors.get(tp), StaleMemberEpoch) for tp in retry):
            batch.stale_retries += 1
            if self._member.member_epoch != batch.epoch:
                delay = 0.0  # the new epoch is known already
            else:
                self._member.heartbeat_now()  # fetch it; the retry follows the backoff
        batch.to_send = retry
        # A timer, not a sleep: this may be gRPC's thread, and the slot stays taken meanwhile.
        timer = threading.Timer(min(delay, max(batch.deadline - now, 0.0)), self._retry_due, (batch,))
        timer.daemon = True
        with self._cond:
            if batch.done or self._stopped:
                return
            self._n.retries += 1
            self._timers[batch] = timer
        timer.start()

    def _may_retry(self, batch: _Batch, error: SluiceError, tp: TopicPartition | None) -> bool:
        member = self._member
        if member.member_id != batch.member_id or member.state is not MemberState.STABLE:
            return False  # left, fenced or rejoined: its old offsets are not its to commit
        if isinstance(error, StaleMemberEpoch):
            # The coordinator moved this member's epoch on while the commit travelled; it is
            # still ours to commit only if the partition stayed here.
            return batch.stale_retries < _STALE_RETRIES and tp is not None and self._holds(tp)
        return error.retriable

    def _finish(self, batch: _Batch, error: SluiceError | None = None) -> None:
        """Give every waiter of ``batch`` its outcome (``error`` overrides the batch's own),
        free its slot and send the pending commit, if any, in it."""
        with self._cond:
            if batch.done:
                return
            batch.done = True
            if batch.holds_slot:
                self._active.remove(batch)
            timer = self._timers.pop(batch, None)
            if timer is not None:
                timer.cancel()
            if error is None and batch.errors:
                error = batch.errors[min(batch.errors)]
            n = self._n
            for w in batch.waiters:
                self._outcomes.append(Outcome(w, dict(batch.carried), error))
                if error is None:
                    n.succeeded += 1
                else:
                    n.failed += 1
                    n.auto_failed += w.auto
            if error is not None:
                n.last_error = str(error)
            self._cond.notify_all()
        self._pump()
