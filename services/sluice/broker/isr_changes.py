"""The leader's half of ISR changes: propose to the controller who leaves and who rejoins the in-sync set.

docs/replication.md, "ISR changes". For every replicated partition this broker leads:

- a follower in the ISR that has not caught up with the leader's log end for ``replica_lag_time_max``
  leaves it (a shrink);
- a follower outside the ISR whose log end reached the high watermark in the current leader epoch rejoins
  it (an expansion).

The leader only proposes (``AlterPartition`` with its leader id, leader epoch and partition epoch); the
controller decides, persists and pushes the new state, and the leader takes the answer at once (the
pushed update brings the same epochs). One proposal per partition in flight; a refused one (a stale
partition epoch: the state moved meanwhile) is proposed again from the newer state on the next check.

Timing: a shrink is a matter of time passing, so it is checked on a timer (a quarter of the lag bound,
50 ms to 1 s); an expansion is an event (a follower's fetch that reached the HW), which wakes the check
at once rather than waiting for the timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc

from sluice.broker.fetch import TopicPartitionKey
from sluice.broker.leader_state import LeaderState
from sluice.broker.metrics import BrokerMetrics
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc
from sluice.v1 import coordinator_pb2

log = logging.getLogger(__name__)

__all__ = ["IsrChanges"]

RPC_TIMEOUT_S = 5.0


class IsrChanges:
    """Proposes ISR changes for the led partitions. Event-loop thread only. Caller: ``leading.Leaders``."""

    def __init__(
        self,
        states: dict[TopicPartitionKey, LeaderState],
        coordinator: str,
        max_lag_ms: int,
        clock_ms: Callable[[], int],
        metrics: BrokerMetrics,
    ) -> None:
        self._states = states
        self._coordinator = coordinator
        self.max_lag_ms = max_lag_ms
        self._clock_ms = clock_ms
        self._metrics = metrics
        self._peers = AioPeers(max_peers=4)
        self._wake = asyncio.Event()
        self._inflight: set[TopicPartitionKey] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._coordinator:
            self._task = asyncio.create_task(self._loop(), name="isr-changes")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._peers.close()

    def nudge(self) -> None:
        """A follower outside the ISR may have caught up: check now."""
        self._wake.set()

    async def _loop(self) -> None:
        interval = min(max(self.max_lag_ms / 4000, 0.05), 1.0)
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._wake.wait()
            self._wake.clear()
            self.check()

    def check(self) -> None:
        """Propose the ISR each led partition should have now, where it differs."""
        now = self._clock_ms()
        for key, state in self._states.items():
            if key in self._inflight:
                continue
            out = set(state.lagging(now, self.max_lag_ms))
            back = set(state.caught_up())
            if not out and not back:
                continue
            new_isr = tuple(r for r in state.replicas if (r in state.isr and r not in out) or r in back)
            self._inflight.add(key)
            task = asyncio.create_task(self._propose(key, state, new_isr), name=f"alter-{key[0]}-{key[1]}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _propose(self, key: TopicPartitionKey, state: LeaderState, new_isr: tuple[int, ...]) -> None:
        old = state.isr
        try:
            answer = await self._peers.coordinator(self._coordinator).AlterPartition(
                coordinator_pb2.AlterPartitionRequest(
                    topic=key[0],
                    partition=key[1],
                    leader_id=state.broker_id,
                    leader_epoch=state.leader_epoch,
                    partition_epoch=state.partition_epoch,
                    new_isr=list(new_isr),
                ),
                timeout=RPC_TIMEOUT_S,
            )
        except grpc.RpcError as exc:
            log.info(
                "ISR change %s -> %s of %s/%s refused: %s",
                list(old),
                list(new_isr),
                *key,
                error_from_rpc(exc),
            )
            return
        finally:
            self._inflight.discard(key)
        if self._states.get(key) is not state or answer.leader_epoch != state.leader_epoch:
            return  # leadership moved meanwhile: the pushed update says what now
        if answer.partition_epoch > state.partition_epoch:
            state.reassign(
                state.replicas,
                tuple(answer.isr),
                state.min_insync_replicas,
                answer.leader_epoch,
                answer.partition_epoch,
                self._clock_ms(),
            )
        # Counted per replica that left or joined, so two followers leaving in one proposal count two.
        left = sum(1 for r in old if r not in state.isr)
        joined = sum(1 for r in state.isr if r not in old)
        if left:
            self._metrics.isr_shrinks.inc(left)
        if joined:
            self._metrics.isr_expands.inc(joined)
        log.info(
            "%s/%s: ISR %s -> %s (partition epoch %d)",
            *key,
            list(old),
            list(state.isr),
            state.partition_epoch,
        )
