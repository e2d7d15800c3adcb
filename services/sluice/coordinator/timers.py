"""The coordinator's timers: broker and dispatcher session expiry, the consumer groups' timer (sessions,
throttled target assignments computed in a worker thread, topic changes) and the consumer-lag refresh.
Each timer writes through :meth:`CoordinatorWriter._write`, like any request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from sluice.common.timeouts import within
from sluice.coordinator.cluster.elections import ElectionResult, elect_after_loss, elect_offline
from sluice.coordinator.groups.assignment import AssignmentJob
from sluice.coordinator.groups.lag import lag_positions, rows_off_loop, time_lag
from sluice.coordinator.groups.model import GroupDescription, Slot, TickOutcome
from sluice.coordinator.metrics import LagKey
from sluice.coordinator.rebuilding import CoordinatorRebuild
from sluice.coordinator.records import Result
from sluice.errors import NotCoordinator, SluiceError, UnknownGroup

log = logging.getLogger(__name__)

Targets = dict[str, frozenset[Slot]]

#: The group timer's cadence while some group has members (targets, topic changes), its session and
#: rebalance-deadline sweep, its gauge refresh, and its longest sleep while no group has members.
GROUP_PERIOD_S = 0.05
GROUP_SWEEP_S = 0.25
GROUP_GAUGES_S = 1.0
GROUP_IDLE_S = 1.0
#: A leader election whose write fails while Redis fails over is tried again this often, this many times
#: (30 s: a Sentinel failover, and a new primary's first replica sync under --metadata-replicas).
ELECTION_RETRY_S = 0.5
ELECTION_ATTEMPTS = 60
#: A group DescribeGroup asked about keeps its lag refreshed (and is exported before the other empty
#: groups) for this long.
ASKED_TTL_S = 600.0


class CoordinatorTimers(CoordinatorRebuild):
    """The timer loops of the leading coordinator (started by ``CoordinatorService.start``)."""

    async def _stop_timers(self) -> None:
        tasks = [t for t in (self._timer, *self._group_tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._timer = None
        self._group_tasks = []

    async def _expiry_loop(self) -> None:
        tick = (
            min(self._settings.broker_session_timeout_ms, self._settings.dispatcher_session_timeout_ms) / 4000
        )
        tick = min(max(tick, 0.05), 1.0)
        while True:
            # A timer, not a poll: sessions expire by the passage of time alone.
            await asyncio.sleep(tick)
            now = self._clock.now_ms()
            brokers, dispatchers = self.cluster.expire(now)
            for b in brokers:
                log.warning("broker %d missed its heartbeats: marked not alive", b)
                self._metrics.session_expirations.labels("broker").inc()
                await self._elect_after_loss(b)
            for d in dispatchers:
                log.warning("dispatcher %s missed its heartbeats: marked not alive", d)
                self._metrics.session_expirations.labels("dispatcher").inc()
            self._metrics.refresh(self.cluster, now)

    async def _elect_after_loss(self, gone: int) -> None:
        """New leaders (and ISRs) for the replicated partitions of a broker whose session expired,
        persisted and pushed (cluster/elections.py). A failed write is retried (bounded: ``_elect_now``)."""
        await self._elect(f"broker {gone} gone", lambda now: elect_after_loss(self.cluster, gone, now))

    async def _elect_offline(self, why: str) -> None:
        """Leaders for offline partitions, now that a broker registered or came back."""
        await self._elect(why, lambda now: elect_offline(self.cluster, now))

    async def _elect(self, why: str, plan: Callable[[int], Result[ElectionResult]]) -> None:
        """Elections wait for the term's view to be rebuilt from the brokers' reports (rebuilding.py)."""
        await self._after_rebuild(lambda: self._elect_now(why, plan))

    async def _elect_now(self, why: str, plan: Callable[[int], Result[ElectionResult]]) -> None:
        def publish(res: ElectionResult) -> None:
            self._publish(res.change)

        # A write that fails while Redis fails over (StorageError, NOT_ENOUGH_REPLICAS) is retried, bounded:
        # nothing else would look at these partitions again until another broker came or went, and they
        # would stay led by a dead broker. Each attempt plans anew on the state reloaded from Redis.
        for attempt in range(1, ELECTION_ATTEMPTS + 1):
            try:
                result = await self._write(plan, publish)
                break
            except NotCoordinator as err:
                log.error("leader elections (%s): no longer the coordinator: %s", why, err)
                return
            except SluiceError as err:
                if not err.retriable or attempt == ELECTION_ATTEMPTS:
                    log.error("leader elections (%s) failed: %s", why, err)
                    return
                log.warning("leader elections (%s) failed (%s); retrying", why, err)
                await asyncio.sleep(ELECTION_RETRY_S)
        else:
            return
        unclean, recovered = set(result.unclean), set(result.recovered)
        for topic, partition, leader in result.leaders:
            log.warning("%s/%d: %s, leader now %d", topic, partition, why, leader)
            kind = "offline" if leader < 0 else "unclean" if (topic, partition) in unclean else "clean"
            kind = "recovery" if (topic, partition) in recovered else kind
            self._metrics.leader_elections.labels(kind).inc()
        for topic, partition in result.recovered:
            log.error(
                "%s/%d: UNCLEAN RECOVERY: every eligible replica restarted unclean; elected the longest log "
                "of those that reported (what no reporting replica kept is lost)",
                topic,
                partition,
            )
        for topic, partition in result.unclean:
            log.error(
                "%s/%d: UNCLEAN leader election (records missing from the new leader are lost)",
                topic,
                partition,
            )

    async def _group_loop(self) -> None:
        """The groups' timer. With live groups (members): throttled target assignments and topic
        changes every 50 ms, sessions and rebalance deadlines every 250 ms, as before, over the live
        groups only. Offsets retention: when its earliest deadline is due (``groups/deadlines.py``).
        Without live groups it sleeps until that deadline (at most a second, for the gauges and the
        heap keeper) or until a group write wakes it: 10,000 empty groups cost nothing in between."""
        last_sweep = last_gauges = 0.0
        gauges_of: tuple[int, int] | None = None  # (state object, its version) the gauges show
        while True:
            await self._group_wait()
            now = time.monotonic()
            due = self.groups.deadlines.next_at()
            sweep = now - last_sweep >= GROUP_SWEEP_S or (due is not None and due <= self._clock.now_ms())
            if sweep:
                last_sweep = now

            def tick(now: int, sweep: bool = sweep) -> Result[TickOutcome]:
                return self.groups.tick(now, sweep, assign_inline=False)

            try:
                for _ in range(64):  # one group per write; bounded so a huge backlog yields to requests
                    outcome = await self._write(tick)
                    self._log_tick(outcome)
                    if not outcome.changed:
                        break
                await self._assign_due_groups()
            except SluiceError as exc:
                log.warning("group timer: %s", exc)
            if now - last_gauges >= GROUP_GAUGES_S:
                last_gauges = now
                # Only when a group record was replayed since (a reload replaces the state object).
                version = (id(self.groups), self.groups.version)
                if self._asked_changed() or version != gauges_of:
                    gauges_of = version
                    self._refresh_group_gauges()
                self._heap.tick()

    async def _group_wait(self) -> None:
        """Until the next thing the group timer has to do: 50 ms while a group has members; otherwise
        the earliest retention deadline, at most ``GROUP_IDLE_S``, or a group write (``_group_wake``)."""
        self._group_wake.clear()
        if self.groups.live:
            self._group_idle = False
            await asyncio.sleep(GROUP_PERIOD_S)
            return
        delay = GROUP_IDLE_S
        due = self.groups.deadlines.next_at()
        if due is not None:
            delay = min(delay, max(0.0, (due - self._clock.now_ms()) / 1000))
        self._group_idle = True
        try:
            await within(self._group_wake.wait(), delay)
        except TimeoutError:
            pass
        finally:
            self._group_idle = False

    def _log_tick(self, outcome: TickOutcome) -> None:
        for group, member, reason in outcome.removed:
            log.warning("group %s: member %s removed (%s)", group, member, reason)
            if self._exporting(group):
                self._metrics.count_fenced(group, reason)
        for group, topic, expr, track in outcome.expired_tracks:
            log.info(
                "group %s: offsets of topic %s read with filter %r (track %s) expired: "
                "unread for --group-offsets-retention",
                group,
                topic,
                expr,
                track,
            )
        for group in outcome.expired_groups:
            self.groups.soft.groups.pop(group, None)
            self._asked.pop(group, None)
        if outcome.expired_groups:
            log.info(
                "%d empty group(s) expired with their offsets (unread for --group-offsets-retention): %s",
                len(outcome.expired_groups),
                ", ".join(outcome.expired_groups[:10])
                + (", ..." if len(outcome.expired_groups) > 10 else ""),
            )

    def _asked_changed(self) -> bool:
        """Forget DescribeGroup asks older than ``ASKED_TTL_S``; whether the asked set changed since the
        last gauge refresh (the exported selection puts asked groups second)."""
        oldest = time.monotonic() - ASKED_TTL_S
        for name in [n for n, at in self._asked.items() if at < oldest]:
            del self._asked[name]
        key = frozenset(self._asked)
        changed = key != self._asked_seen
        self._asked_seen = key
        return changed

    def _refresh_group_gauges(self) -> None:
        groups = self.groups
        selected = self._group_metrics.select(
            (n for n, g in groups.groups.items() if g.exists), groups.live, self._asked
        )
        self._exported_groups = self._metrics.refresh_groups(groups, self._exported_groups, selected)

    async def _assign_due_groups(self) -> None:
        """Compute the throttled target assignments in a worker thread, from a snapshot, outside the
        write lock; then write each as records under it (groups/assignment.py). Heartbeats keep being
        answered meanwhile (the thread yields the GIL every few milliseconds)."""
        for job in self.groups.assignment_jobs(self._clock.now_ms()):
            try:
                started = time.perf_counter()
                targets = await asyncio.to_thread(job.compute)
                took = time.perf_counter() - started
                if took > 0.5:
                    log.info(
                        "group %s: target of %d members computed in %.2fs", job.group, len(job.members), took
                    )
            except BaseException:
                self.groups.abandon_assignment(job)
                raise

            def apply(now: int, job: AssignmentJob = job, targets: Targets = targets) -> Result[TickOutcome]:
                return self.groups.apply_assignment(job, targets, now)

            try:
                await self._write(apply)
            except SluiceError:
                self.groups.abandon_assignment(job)
                raise

    async def _lag_loop(self) -> None:
        while True:
            await asyncio.sleep(self._lag_interval_s)
            try:
                await self.refresh_lag()
            except SluiceError as exc:
                log.warning("consumer lag refresh: %s", exc)

    def _lag_groups(self) -> list[str]:
        """The groups whose lag is refreshed: exported ones (``group_metrics.py``) that have members,
        were asked about within ``ASKED_TTL_S``, or are named by ``--group-metrics-groups``. Not every
        group ever seen: an empty group's lag moves only with its topics, and nobody is reading it."""
        named = self._group_metrics.named
        return sorted(
            n for n in self._exported_groups if n in self.groups.live or n in self._asked or named(n)
        )

    async def refresh_lag(self) -> None:
        """Set ``sluice_coordinator_consumer_lag`` (records) and ``_consumer_lag_seconds`` for the groups
        of ``_lag_groups`` (the largest over a broadcasting group's members); remove the series of
        partitions no such group reads any more.

        High watermarks come from the shared log-end cache (``groups/log_end.py``): the partitions of
        every group refreshed are asked for once, one ListOffsets per broker. Seconds behind = now -
        timestamp of the first unconsumed record, read per group with one Fetch per broker for the
        lagging partitions (``LagReader.record_timestamps``); 0 when caught up, no series while that
        record cannot be read."""
        inputs = []
        wanted: set[tuple[str, int]] = set()
        for name in self._lag_groups():
            try:
                description: GroupDescription | None = self.groups.lag_view(name)
            except UnknownGroup:
                description = None
            committed, partitions = await self._lag.inputs(description, name)
            inputs.append((name, description, committed, len(partitions)))
            wanted |= partitions
        ends = await self._log_end.get(self.cluster, wanted, self._lag_interval_s / 2) if wanted else {}
        self._log_end.forget_older_than(3 * max(self._lag_interval_s, 1.0))
        lag: dict[LagKey, int] = {}
        seconds: dict[LagKey, float] = {}
        for name, description, committed, count in inputs:
            rows = await rows_off_loop(description, committed, ends, count)
            lagging = lag_positions(rows)
            stamps = await self._lag.record_timestamps(self.cluster, lagging) if lagging else {}
            now_ms = self._clock.now_ms()
            for row in rows:
                if row.lag < 0:
                    continue
                key = (name, row.track, row.topic, str(row.partition))
                lag[key] = max(lag.get(key, 0), row.lag)
                behind = time_lag(row, stamps, now_ms)
                if behind is not None:
                    seconds[key] = max(seconds.get(key, 0.0), behind[0] / 1000)
        self._lag_series = self._metrics.set_lag(lag, seconds, self._lag_series)
