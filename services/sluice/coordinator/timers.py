"""The coordinator's timers: broker and dispatcher session expiry, the consumer groups' timer (sessions,
throttled target assignments computed in a worker thread, topic changes) and the consumer-lag refresh.
Each timer writes through :meth:`CoordinatorWriter._write`, like any request.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sluice.coordinator.groups.assignment import AssignmentJob
from sluice.coordinator.groups.lag import lag_positions, time_lag
from sluice.coordinator.groups.model import GroupDescription, Slot, TickOutcome
from sluice.coordinator.metrics import LagKey
from sluice.coordinator.records import Result
from sluice.coordinator.writer import CoordinatorWriter
from sluice.errors import SluiceError, UnknownGroup

log = logging.getLogger(__name__)

Targets = dict[str, frozenset[Slot]]


class CoordinatorTimers(CoordinatorWriter):
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
            for d in dispatchers:
                log.warning("dispatcher %s missed its heartbeats: marked not alive", d)
                self._metrics.session_expirations.labels("dispatcher").inc()
            self._metrics.refresh(self.cluster, now)

    async def _group_loop(self) -> None:
        """The groups' timer: throttled target assignments and topic changes every 50 ms; sessions and
        rebalance deadlines every 250 ms; gauges every second."""
        period, sweep_every, gauges_every = 0.05, 5, 20
        n = 0
        while True:
            await asyncio.sleep(period)
            n += 1
            sweep = n % sweep_every == 0

            def tick(now: int, sweep: bool = sweep) -> Result[TickOutcome]:
                return self.groups.tick(now, sweep, assign_inline=False)

            try:
                for _ in range(64):  # one group per write; bounded so a huge backlog yields to requests
                    outcome = await self._write(tick)
                    for group, member, reason in outcome.removed:
                        log.warning("group %s: member %s removed (%s)", group, member, reason)
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
                    if not outcome.changed:
                        break
                await self._assign_due_groups()
            except SluiceError as exc:
                log.warning("group timer: %s", exc)
            if n % gauges_every == 0:
                self._exported_groups = self._metrics.refresh_groups(self.groups, self._exported_groups)
                self._heap.tick()

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

    async def refresh_lag(self) -> None:
        """Set ``sluice_coordinator_consumer_lag`` (records) and ``_consumer_lag_seconds`` for every group
        (the largest over a broadcasting group's members); remove the series of partitions no group
        reads any more.

        Seconds behind = now - timestamp of the first unconsumed record, read per group with one Fetch
        per broker for the lagging partitions (``LagReader.record_timestamps``); 0 when caught up, no
        series while that record cannot be read."""
        lag: dict[LagKey, int] = {}
        seconds: dict[LagKey, float] = {}
        for name in sorted(self.groups.groups):
            try:
                description: GroupDescription | None = self.groups.lag_view(name)
            except UnknownGroup:
                description = None
            rows = await self._lag.rows(self.cluster, description, name)
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
