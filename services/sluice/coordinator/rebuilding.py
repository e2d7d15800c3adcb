"""A new controller term rebuilds its view from the brokers' reports before it elects anyone.

Redis replicates asynchronously, so the view a term loads may have lost the latest leader, ISR or epoch
changes (a Sentinel failover to a replica that missed them). The brokers obeyed those changes and persisted
their epochs. At the start of every term:

1. each broker gets its full assignment in the answer to its first heartbeat of the term (even when its
   metadata version matches: a lost change and a later one can share a version);
2. a broker that holds newer epochs than that assignment ignores those partitions and reports them in its
   next heartbeat, which it sends at once (``broker/epoch_reports.py``);
3. once every registered broker has heartbeated after its full assignment, or a session timeout after the
   term began, the reports are merged (``cluster/rebuild.py``: the newest state, epochs raised above
   everything seen), persisted and pushed, and only then do the elections that waited run;
4. a broker not heard from at all this term (dead before it began) has no session to expire, so its
   partitions are elected then, as after a session expiry.

Reports arriving later (a broker that was down) are merged when they come. Only clusters with replicated
partitions wait: without them nothing can be elected and nothing is forced.
docs/replication.md, "Controller state that cannot roll back".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from sluice.common.timeouts import within
from sluice.coordinator.cluster.model import BrokerHeartbeatResult
from sluice.coordinator.cluster.rebuild import MAX_REPORTS, EpochReport, RebuildResult, merge_reports
from sluice.coordinator.cluster.sessions import Liveness
from sluice.coordinator.writer import CoordinatorWriter
from sluice.errors import SluiceError

log = logging.getLogger(__name__)

__all__ = ["CoordinatorRebuild", "TermReports"]

#: Elections deferred while the term's reports are awaited (one per expired broker or registration).
MAX_DEFERRED = 10_000


@dataclasses.dataclass
class TermReports:
    """Which brokers of this term have had their full assignment and have reported since."""

    expected: set[int]
    assigned: set[int] = dataclasses.field(default_factory=set)
    reported: set[int] = dataclasses.field(default_factory=set)
    pending: list[EpochReport] = dataclasses.field(default_factory=list)
    all_reported: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    opened: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    deferred: list[Callable[[], Awaitable[None]]] = dataclasses.field(default_factory=list)

    def heard(self, broker_id: int) -> None:
        if broker_id in self.assigned:
            self.reported.add(broker_id)
            if self.expected <= self.reported:
                self.all_reported.set()


class CoordinatorRebuild(CoordinatorWriter):
    """The term's report gate. ``_begin_rebuild`` at the start of a term; ``_term_heartbeat`` on every
    broker heartbeat; ``_after_rebuild`` runs an election now or once the reports are in."""

    _term: TermReports | None = None

    def _begin_rebuild(self) -> asyncio.Task[None]:
        """Start this term's gate; returns its task (a timer of the term, cancelled with the others)."""
        replicated = any(len(s.replicas) > 1 for t in self.cluster.topics.values() for s in t.states)
        term = TermReports(set(self.cluster.brokers) if replicated else set())
        self._term = term
        if not term.expected:
            term.opened.set()
        wait_s = self._settings.broker_session_timeout_ms / 1000
        return asyncio.get_running_loop().create_task(self._open_when_reported(term, wait_s))

    async def _open_when_reported(self, term: TermReports, wait_s: float) -> None:
        if term.opened.is_set():
            return
        started = time.monotonic()
        try:
            await within(term.all_reported.wait(), wait_s)
            log.info(
                "controller view: every registered broker reported in %.1f s (%d partitions ahead of Redis)",
                time.monotonic() - started,
                len({(r.topic, r.partition) for r in term.pending}),
            )
        except TimeoutError:
            log.warning(
                "controller view: brokers %s did not report within %.1f s; electing without them",
                sorted(term.expected - term.reported),
                wait_s,
            )
        await self._merge(term.pending, "the term's reports")
        term.pending = []
        term.opened.set()
        deferred, term.deferred = term.deferred, []
        for run in deferred:
            await run()
        # A broker not heard from all this term (it died before the term began, e.g. with the previous
        # coordinator) never gets a session here, so it would never expire: it is gone, now. So is one
        # that expired while an earlier term's gate was closed (a re-election drops that term's deferred
        # elections). Idempotent: a broker already out of every ISR changes nothing.
        now = self._clock.now_ms()
        for broker_id in sorted(term.expected):
            liveness = self.cluster.broker_liveness(broker_id, now)
            if liveness is Liveness.ALIVE:
                continue
            if liveness is Liveness.UNKNOWN:
                log.warning("broker %d not heard from this term: electing leaders without it", broker_id)
            await self._elect_after_loss(broker_id)

    async def _elect_after_loss(self, gone: int) -> None:
        """Elections after ``gone``'s loss (``timers.CoordinatorTimers``)."""
        raise NotImplementedError

    async def _after_rebuild(self, run: Callable[[], Awaitable[None]]) -> None:
        """Run an election now, or once this term's view is rebuilt from the brokers' reports."""
        term = self._term
        if term is None or term.opened.is_set():
            await run()
        elif len(term.deferred) < MAX_DEFERRED:
            term.deferred.append(run)

    def _term_assignment(self, broker_id: int, res: BrokerHeartbeatResult) -> BrokerHeartbeatResult:
        """The heartbeat's answer, with the broker's full assignment if it has not had one this term."""
        term = self._term
        if term is None or not term.expected or res.error is not None or broker_id in term.assigned:
            return res
        term.assigned.add(broker_id)
        if res.update is not None:
            return res
        return dataclasses.replace(res, update=self.cluster.broker_assignment(broker_id))

    async def _term_heartbeat(self, broker_id: int, reports: Iterable[EpochReport]) -> None:
        """A heartbeat's reports: held until the term's gate opens, merged at once afterwards."""
        taken = list(reports)[:MAX_REPORTS]
        term = self._term
        if term is None:
            return
        if not term.opened.is_set():
            term.pending.extend(taken)
            term.heard(broker_id)
        elif taken:
            await self._merge(taken, f"broker {broker_id}'s report")

    async def _merge(self, reports: list[EpochReport], why: str) -> None:
        if not reports:
            return

        def publish(res: RebuildResult) -> None:
            self._publish(res.change)

        try:
            result = await self._write(lambda _now: merge_reports(self.cluster, reports), publish)
        except SluiceError as err:
            log.error("controller view: merging %s failed: %s", why, err)
            return
        for topic, partition, state in result.rebuilt:
            log.warning(
                "%s/%d: the metadata store was behind the brokers; rebuilt from %s: leader %d, ISR %s, "
                "leader epoch %d, partition epoch %d",
                topic,
                partition,
                why,
                state.leader,
                list(state.isr),
                state.leader_epoch,
                state.partition_epoch,
            )
