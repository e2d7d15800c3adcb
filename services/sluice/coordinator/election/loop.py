"""The driver shared by both electors: runs the pure ``ElectionMachine`` against a ``LeaseStore``.

Polling the store every ``retry_period`` is inherent to lease election (client-go does the same): a lease
expires by the passage of time, which no store announces. Between polls the loop waits on an event, so a
``resign()`` or ``fenced()`` is acted on at once.

Every store call is bounded by a timeout; a leader's renewal by the time left before its deadline, so a
hung store cannot keep a replica acting as leader. ``on_elected``/``on_lost`` run on their own task, one
at a time and in order, so a slow ``on_elected`` (the coordinator reloading its state) never delays a
renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from sluice.common.timeouts import within
from sluice.coordinator.election.base import Candidate, LeaseStore, OnElected, OnLost
from sluice.coordinator.election.machine import (
    Action,
    ElectionMachine,
    ElectionState,
    ElectionTiming,
    LeaderInfo,
    LeaseRecord,
)
from sluice.coordinator.election.metrics import election_metrics

log = logging.getLogger(__name__)

Clock = Callable[[], float]
T = TypeVar("T")


class ElectionLoop:
    """An ``Elector`` over any ``LeaseStore``. Subclasses only pick the store (see redis_elector.py,
    kubernetes_elector.py)."""

    #: Shown in logs and metrics ("redis" or "kubernetes").
    backend = "lease"

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        address: str,
        timing: ElectionTiming,
        *,
        clock: Clock = time.monotonic,
    ) -> None:
        self._store = store
        self._timing = timing
        self._clock = clock
        self._machine = ElectionMachine(identity, address, timing)
        self._candidate = Candidate(identity, address, timing.lease_duration)
        self._wake = asyncio.Event()
        self._resign_requested = False
        self._fence_requested = False
        self._done = False
        self._running = False
        self._finished = asyncio.Event()
        #: Epoch whose ``on_elected`` returned and whose ``on_lost`` has not run yet.
        self._in_office: int | None = None
        self._events: asyncio.Queue[tuple[str, int]] = asyncio.Queue()
        self._metrics = election_metrics()

    # ---- Elector -----------------------------------------------------------------------------------

    @property
    def identity(self) -> str:
        return self._machine.identity

    @property
    def state(self) -> ElectionState:
        return self._machine.state

    def is_leader(self) -> bool:
        held = self._machine.held
        return (
            held is not None
            and self._in_office == held.epoch
            and not self._fence_requested
            and self._machine.leading(self._clock())
        )

    def leader(self) -> LeaderInfo | None:
        return self._machine.leader(self._clock())

    def fenced(self) -> None:
        if self._machine.state is ElectionState.LEADER:
            log.error("election: the metadata store fenced this leader; stepping down")
            self._fence_requested = True
            self._wake.set()

    async def resign(self) -> None:
        self._resign_requested = True
        self._wake.set()
        if self._running:
            await self._finished.wait()

    async def run(self, on_elected: OnElected, on_lost: OnLost) -> None:
        assert not self._running, "an elector runs once"
        self._running = True
        worker = asyncio.get_running_loop().create_task(
            self._callbacks(on_elected, on_lost), name=f"election-{self.backend}-callbacks"
        )
        log.info(
            "election (%s): %s at %s standing for leader",
            self.backend,
            self._candidate.identity,
            self._candidate.address,
        )
        try:
            while not self._done:
                if self._resign_requested:
                    await self._do_resign(hold_off=float("inf"))
                    self._done = True
                    break
                if self._fence_requested:
                    self._fence_requested = False
                    await self._do_resign(hold_off=self._timing.retry_period)
                await self._step()
                await self._sleep_until(self._machine.wake_at(self._clock()))
            # Let on_lost run before returning: the caller may close what it uses right after.
            await self._events.join()
        finally:
            held = self._machine.held
            if held is not None:
                # Cancelled while leading (a crash, to the outside world): stop acting as leader locally.
                self._machine.resign(self._clock(), float("inf"))
                self._stepped_down(held, "the election loop stopped")
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            self._finished.set()

    # ---- one step ----------------------------------------------------------------------------------

    async def _step(self) -> None:
        m = self._machine
        held = m.held
        action = m.poll(self._clock())
        if action is Action.STEP_DOWN:
            assert held is not None
            log.error(
                "election: no renewal succeeded within the %gs renew deadline: stepping down",
                self._timing.renew_deadline,
            )
            self._stepped_down(held, "renew deadline passed")
            await self._release(held)
        elif action is Action.RENEW:
            assert held is not None
            await self._renew(held)
        elif action is Action.OBSERVE:
            await self._observe()

    async def _observe(self) -> None:
        m = self._machine
        try:
            record = await _bounded(self._store.read(), self._timing.renew_deadline)
        except Exception as exc:
            log.warning("election: cannot read the lease: %s", _why(exc))
            m.observe_failed(self._clock())
            return
        previous = m.leader(self._clock())
        if m.observed(record, self._clock()) is Action.ACQUIRE:
            await self._acquire(record)
        current = m.leader(self._clock())
        if current is not None and current != previous and current.identity != self.identity:
            log.info(
                "election: following leader %s at %s (epoch %d)",
                current.identity,
                current.address,
                current.epoch,
            )

    async def _acquire(self, expected: LeaseRecord | None) -> None:
        m = self._machine
        sent_at = self._clock()
        try:
            won, record = await _bounded(
                self._store.acquire(expected, self._candidate), self._timing.renew_deadline
            )
        except Exception as exc:
            log.warning("election: acquiring the lease failed: %s", _why(exc))
            m.acquire_failed(self._clock())
            return
        if not won:
            m.acquire_lost(record, self._clock())
            return
        assert record is not None
        if m.acquired(record, sent_at, self._clock()) is Action.STEP_DOWN:
            log.warning("election: won the lease too late to use it (slow store); releasing it")
            await self._release(record)
            return
        log.info("election: %s is the leader with epoch %d", self.identity, record.epoch)
        self._metrics.transitions.labels("leader").inc()
        self._events.put_nowait(("elected", record.epoch))

    async def _renew(self, held: LeaseRecord) -> None:
        m = self._machine
        sent_at = self._clock()
        try:
            ok, record = await _bounded(self._store.renew(held), m.deadline - sent_at)
        except Exception as exc:
            log.warning("election: renewing the lease failed: %s", _why(exc))
            action = m.renew_failed(self._clock())
            if action is Action.STEP_DOWN:
                self._stepped_down(held, "renew deadline passed")
                await self._release(held)
            return
        if ok:
            assert record is not None
            if m.renewed(record, sent_at, self._clock()) is Action.STEP_DOWN:
                self._stepped_down(held, "renewal confirmed after the renew deadline")
                await self._release(record)
            return
        if m.renew_lost(record, self._clock()) is Action.STEP_DOWN:
            holder = record.holder if record is not None and record.holder else "nobody"
            log.error("election: lost the lease (now held by %s): stepping down", holder)
            self._stepped_down(held, "lease lost")

    async def _do_resign(self, hold_off: float) -> None:
        held = self._machine.held
        if self._machine.resign(self._clock(), hold_off) is Action.STEP_DOWN:
            assert held is not None
            log.info("election: %s resigns as leader", self.identity)
            self._stepped_down(held, "resigned")
            await self._release(held)

    def _stepped_down(self, held: LeaseRecord, why: str) -> None:
        self._metrics.transitions.labels("follower").inc()
        self._events.put_nowait(("lost", held.epoch))
        log.info("election: epoch %d is over (%s)", held.epoch, why)

    async def _release(self, held: LeaseRecord) -> None:
        try:
            await _bounded(self._store.release(held), self._timing.retry_period)
        except Exception as exc:
            # A courtesy only: the lease expires on its own.
            log.warning("election: could not release the lease (it will expire): %s", _why(exc))

    # ---- callbacks, waiting --------------------------------------------------------------------------

    async def _callbacks(self, on_elected: OnElected, on_lost: OnLost) -> None:
        while True:
            kind, epoch = await self._events.get()
            try:
                if kind == "elected":
                    await self._take_office(on_elected, epoch)
                elif self._in_office == epoch:
                    self._in_office = None
                    self._metrics.leader.set(0)
                    await on_lost()
            except Exception:
                log.exception("election: the %s callback for epoch %d failed", kind, epoch)
            finally:
                self._events.task_done()

    async def _take_office(self, on_elected: OnElected, epoch: int) -> None:
        held = self._machine.held
        if held is None or held.epoch != epoch:
            return  # already lost again; its "lost" event follows and finds nothing in office
        try:
            await on_elected(epoch)
        except Exception:
            log.exception("election: could not take office with epoch %d; resigning", epoch)
            self.fenced()  # same remedy: step down, release, stand again after a short hold-off
            return
        self._in_office = epoch
        self._metrics.leader.set(1)
        self._metrics.epoch.set(epoch)

    async def _sleep_until(self, when: float) -> None:
        delay = when - self._clock()
        if delay > 0 and not (self._resign_requested or self._fence_requested):
            with contextlib.suppress(TimeoutError):
                await within(self._wake.wait(), delay)
        self._wake.clear()


async def _bounded(call: Coroutine[Any, Any, T], seconds: float) -> T:
    """Await a store call for at most ``seconds`` (TimeoutError after)."""
    return await within(call, max(seconds, 0.001))


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return f"{type(exc).__name__}: {exc}"
