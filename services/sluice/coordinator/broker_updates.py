"""Pushing partition changes to brokers (``sluice.v1.Broker/UpdatePartitions``), best effort, in order.

Brokers also learn everything from heartbeats (a full assignment whenever their version differs), so a push
only makes a change visible sooner: CreateTopic waits for the brokers' acknowledgements so that a produce
right after it succeeds.

Correctness rests on one broker-side rule and one coordinator-side rule (docs/coordinator.md):

- broker: apply an update only if its ``metadata_version`` is greater than the version it has applied (a
  full update with an equal version is harmless); a broker with nothing applied yet (version 0, e.g. just
  restarted) accepts only a full update. So a broker's version only grows, and every state it reaches is a
  consistent snapshot at that version.
- coordinator (here): per broker, pushes go one at a time in version order; a delta ``base -> version`` is
  sent only when the broker is known to be at exactly ``base`` (from its last acknowledgement or heartbeat);
  otherwise the broker gets its full assignment. After a failed push we know nothing (``UNKNOWN``) until
  the next heartbeat, so the next push is a full one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import grpc

from sluice.common.peers import AioPeers
from sluice.common.rpc import answered_error, error_from_rpc
from sluice.coordinator.cluster.model import BrokerUpdate, Endpoint, MetadataChange, PartitionRef
from sluice.coordinator.convert import broker_update_to_proto
from sluice.errors import RequestTimedOut

log = logging.getLogger(__name__)

UNKNOWN_VERSION = -1
#: Added to a push's deadline per partition it assigns or removes: creating a log costs the broker a few
#: fsyncs (6.5 ms per partition measured on the development VM's disk, more under load), so a fixed
#: deadline would report every large CreateTopic as unacknowledged. docs/coordinator.md.
DEADLINE_PER_PARTITION_S = 0.025
#: No push waits longer than this, however large (a hung broker must not hold its queue for minutes).
MAX_DEADLINE_S = 120.0


@dataclass(frozen=True)
class PushFailure:
    """Why a broker did not acknowledge a change (for the caller's answer)."""

    reason: str
    #: The broker answered that it could not apply the change (a typed error), as opposed to no answer
    #: (unreachable, deadline passed, not alive), after which its heartbeats may still bring it the change.
    answered: bool = False


#: How a push ended for one broker: None when it acknowledged.
PushOutcome = PushFailure | None


#: Unanswered pushes kept per broker for its heartbeat to settle (older ones fail at once beyond this).
MAX_AWAITING = 1_000


@dataclass
class _Pending:
    base_version: int
    delta: BrokerUpdate
    done: asyncio.Future[PushOutcome]


@dataclass
class _PushQueue:
    """One broker's ordered pushes (its channel is the peer layer's, by address)."""

    broker_id: int
    endpoint: Endpoint
    known_version: int = UNKNOWN_VERSION
    queue: deque[_Pending] = field(default_factory=deque)
    #: Removals that failed to reach the broker: sent again with its next update.
    unsent_removals: set[PartitionRef] = field(default_factory=set)
    worker: asyncio.Task[None] | None = None


class BrokerNotifier:
    """One ordered push queue per broker.

    Caller: the service layer, under its write lock for ``registered``/``observed``/``submit`` (so pushes
    are queued in version order). Affects: soft state only (what each broker is known to have; the
    channels are in the peer layer's cache, dropped when a broker moves to another address).
    """

    def __init__(
        self,
        full_update: Callable[[int], BrokerUpdate],
        timeout_s: float,
        on_result: Callable[[bool], None] | None = None,
        controller_epoch: Callable[[], int] = lambda: 0,
    ) -> None:
        self._full_update = full_update
        #: The coordinator's current term, stamped on every push (brokers refuse an older one).
        self._controller_epoch = controller_epoch
        self._timeout_s = timeout_s
        self._on_result = on_result
        self._links: dict[int, _PushQueue] = {}
        self._closed = False
        self._peers = AioPeers()
        #: Per broker: pushes it did not answer in time, and the version each needs.
        #: A slow broker may still apply them; its next heartbeat settles them (``observed``).
        self._awaiting: dict[int, list[tuple[int, asyncio.Future[PushOutcome]]]] = {}

    def registered(self, broker_id: int, endpoint: Endpoint, known_version: int = UNKNOWN_VERSION) -> None:
        """A broker (re)registered or was recovered from the store. A new incarnation starts at version 0."""
        link = self._links.get(broker_id)
        if link is None or link.endpoint != endpoint:
            if link is not None:
                self._peers.drop(str(link.endpoint))
            new = _PushQueue(broker_id, endpoint)
            if link is not None:
                # Keep queued work: the worker below sends it over the new channel.
                new.queue, new.worker, new.unsent_removals = link.queue, link.worker, link.unsent_removals
            self._links[broker_id] = new
            link = new
        link.known_version = known_version

    def observed(self, broker_id: int, reported_version: int) -> None:
        """A heartbeat told us the broker's applied version."""
        link = self._links.get(broker_id)
        if link is not None:
            link.known_version = reported_version
            self._resend_removals(link)
        self._settle_awaiting(broker_id, reported_version)

    def owe_removals(self, broker_id: int, refs: Iterable[PartitionRef]) -> None:
        """Removals the broker is owed outside any metadata change (its stray replicas, found at its
        registration: cluster/strays.py): they ride on its next update, like removals whose push failed."""
        link = self._links.get(broker_id)
        if link is not None:
            link.unsent_removals.update(refs)

    def with_owed_removals(self, broker_id: int, update: BrokerUpdate) -> BrokerUpdate:
        """A full update answered outside the push queue (a heartbeat's) with the removals still owed to the
        broker: those queued or in flight, and those that failed to reach it.

        Why: the heartbeat's full update can reach the broker first, at the version of a queued delta that
        carries a removal. The broker then takes the full update (which unserves but never deletes), and
        ignores the delta as stale, so without this the removed replica's data stayed on disk for ever
        (found by test_reassignment under the suite's load)."""
        link = self._links.get(broker_id)
        if link is None or not update.full:
            return update
        queued = [r for p in link.queue for r in p.delta.remove]
        return _with_removals(update, [*link.unsent_removals, *queued])

    def _resend_removals(self, link: _PushQueue) -> None:
        """Removals that failed to reach the broker ride on its next update; when none is coming (a
        drained broker is assigned nothing more), the heartbeat that shows it is back sends them in a
        full update of their own, so its data of the moved partitions is deleted."""
        if not link.unsent_removals or link.queue or link.worker is not None or self._closed:
            return
        full = self._full_update(link.broker_id)
        done: asyncio.Future[PushOutcome] = asyncio.get_running_loop().create_future()
        link.queue.append(_Pending(UNKNOWN_VERSION, full, done))
        link.worker = asyncio.get_running_loop().create_task(
            self._drain(link.broker_id), name=f"push-broker-{link.broker_id}"
        )

    def _settle_awaiting(self, broker_id: int, applied_version: int) -> None:
        """Acknowledge the unanswered pushes the broker has applied by now (its version only grows and every
        version it reaches includes all earlier changes, docs/coordinator.md); keep waiting for the rest (the
        caller's wait bounds that)."""
        waiting = self._awaiting.pop(broker_id, [])
        still = []
        for version, done in waiting:
            if done.done():
                continue
            if 0 < version <= applied_version:
                _resolve(done, None)
            else:
                still.append((version, done))
        if still:
            self._awaiting[broker_id] = still

    def _await_heartbeat(self, broker_id: int, pending: _Pending) -> None:
        waiting = self._awaiting.setdefault(broker_id, [])
        waiting.append((pending.delta.metadata_version, pending.done))
        while len(waiting) > MAX_AWAITING:
            _resolve(waiting.pop(0)[1], PushFailure("no answer, and too many unanswered updates to wait for"))

    def submit(
        self, change: MetadataChange, live_brokers: Iterable[int]
    ) -> dict[int, asyncio.Future[PushOutcome]]:
        """Queue ``change`` for every live broker (unaffected ones get an empty delta: it keeps their
        deltas contiguous). Returns a future per affected live broker: None once acknowledged, else
        why it was not."""
        loop = asyncio.get_running_loop()
        affected = change.affected
        futures = {}
        for broker_id in live_brokers:
            link = self._links.get(broker_id)
            done: asyncio.Future[PushOutcome] = loop.create_future()
            if link is None or self._closed:
                why = "the coordinator has no connection to it" if link is None else "shutting down"
                done.set_result(PushFailure(why))
            else:
                delta = change.delta_for(broker_id)
                if delta.assign and link.unsent_removals:
                    # Assigned again (same topic_id): an owed removal of it would now delete a replica.
                    again = {(r.topic, r.partition) for r in delta.assign}
                    link.unsent_removals = {
                        r for r in link.unsent_removals if (r.topic, r.partition) not in again
                    }
                link.queue.append(_Pending(change.base_version, delta, done))
                if link.worker is None:
                    link.worker = loop.create_task(self._drain(broker_id), name=f"push-broker-{broker_id}")
            if broker_id in affected:
                futures[broker_id] = done
        return futures

    async def _drain(self, broker_id: int) -> None:
        try:
            while True:
                link = self._links[broker_id]  # looked up each round: re-registration may swap the channel
                if not link.queue:
                    return
                head = link.queue[0]
                if link.known_version == head.base_version and link.known_version > 0:
                    update = _with_removals(head.delta, link.unsent_removals)
                else:
                    queued = [r for p in link.queue for r in p.delta.remove]
                    update = _with_removals(self._full_update(broker_id), [*link.unsent_removals, *queued])
                failure, final = await self._send(link, update)
                link = self._links[broker_id]
                if failure is None:
                    link.unsent_removals.difference_update(update.remove)
                    link.known_version = update.metadata_version
                    self._settle_awaiting(broker_id, update.metadata_version)
                    # The update covers every queued change up to its version (a full one covers all).
                    while link.queue and link.queue[0].delta.metadata_version <= update.metadata_version:
                        _resolve(link.queue.popleft().done, None)
                    if link.queue and link.queue[0] is head:  # cannot happen: a full is never older
                        _resolve(link.queue.popleft().done, PushFailure("superseded"))
                else:
                    link.known_version = UNKNOWN_VERSION
                    link.unsent_removals.update(update.remove)
                    while link.queue:
                        pending = link.queue.popleft()
                        link.unsent_removals.update(pending.delta.remove)
                        if final:
                            _resolve(pending.done, failure)
                        else:
                            self._await_heartbeat(broker_id, pending)
        finally:
            current = self._links.get(broker_id)
            if current is not None:
                current.worker = None

    async def _send(self, link: _PushQueue, update: BrokerUpdate) -> tuple[PushOutcome, bool]:
        """Push one update: (None, True) when acknowledged, else why not as text for the caller's answer,
        and whether that is final: False only when the deadline passed (a slow broker may still apply the
        update, which its next heartbeat tells); an error it answered, or an unreachable broker, is final."""
        try:
            deadline = self.deadline_s(len(update.assign) + len(update.remove))
            stub = self._peers.broker(str(link.endpoint))
            request = broker_update_to_proto(update, self._controller_epoch())
            await stub.UpdatePartitions(request, timeout=deadline)
        except grpc.RpcError as exc:
            answered = answered_error(exc)
            failure = error_from_rpc(exc)
            reason = str(answered) if answered is not None else f"no answer ({failure})"
            log.warning(
                "UpdatePartitions (version %d, full=%s) to broker %d at %s failed: %s; heartbeats reconcile",
                update.metadata_version,
                update.full,
                link.broker_id,
                link.endpoint,
                reason,
            )
            self._count(False)
            # Only a deadline leaves the outcome open (the broker may yet apply it); a refusal or an
            # unreachable broker is final.
            timed_out = answered is None and isinstance(failure, RequestTimedOut)
            return PushFailure(reason, answered is not None), not timed_out
        self._count(True)
        return None, True

    def deadline_s(self, partitions: int) -> float:
        """The deadline of a push naming ``partitions`` partitions."""
        return min(self._timeout_s + DEADLINE_PER_PARTITION_S * partitions, MAX_DEADLINE_S)

    def _count(self, ok: bool) -> None:
        if self._on_result is not None:
            self._on_result(ok)

    async def close(self) -> None:
        self._closed = True
        workers = [link.worker for link in self._links.values() if link.worker is not None]
        for w in workers:
            w.cancel()
        for w in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await w
        for link in self._links.values():
            while link.queue:
                _resolve(link.queue.popleft().done, PushFailure("the coordinator is shutting down"))
        for waiting in self._awaiting.values():
            for _, done in waiting:
                _resolve(done, PushFailure("the coordinator is shutting down"))
        self._awaiting.clear()
        await self._peers.close()
        self._links.clear()


def _with_removals(update: BrokerUpdate, extra: Iterable[PartitionRef]) -> BrokerUpdate:
    """``update`` plus removals it would otherwise lose.

    A full update tells a broker what to serve, but brokers delete a partition's data only on an explicit
    removal (matched by topic_id, so repeating one is harmless). So a full update carries the removals of
    the queued deltas it replaces, and any update carries removals that failed to reach the broker before.
    Removals of partitions the update assigns (a topic deleted and re-created) are left out: the new
    topic_id already tells the broker to replace the old log.
    """
    assigned = {(r.topic, r.partition) for r in update.assign}
    removals = {*update.remove, *(r for r in extra if (r.topic, r.partition) not in assigned)}
    if len(removals) == len(update.remove):
        return update
    return replace(update, remove=tuple(sorted(removals)))


def _resolve(fut: asyncio.Future[PushOutcome], value: PushOutcome) -> None:
    if not fut.done():
        fut.set_result(value)
