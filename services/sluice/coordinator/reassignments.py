"""The coordinator's reassignment calls (``cluster/reassign.py`` on the one write path): start partitions'
reassignments, and complete each once its added replicas are in sync. docs/replication.md, "Reassignment".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from sluice.coordinator.cluster.reassign import (
    Reassignment,
    ReassignResult,
    cancel_reassignments,
    complete_reassignment,
    completed,
    reassigning,
    start_reassignments,
)
from sluice.coordinator.cluster.replication import PartitionState
from sluice.coordinator.timers import CoordinatorTimers
from sluice.errors import NotCoordinator, SluiceError

log = logging.getLogger(__name__)

#: A completion write that failed (Redis unreachable for a moment) is tried again this often, this many
#: times: nothing else would trigger it, since the ISR change that should have is already written.
RETRY_S = 1.0
RETRIES = 60

__all__ = ["CoordinatorReassignments"]


class CoordinatorReassignments(CoordinatorTimers):
    """Reassignment on the leading coordinator. Completion is driven by events, never polled: the ISR
    expansion that brings the last added replica in (``AlterPartition``) completes it in the next write,
    and a new term completes any whose completion the previous term did not write."""

    def _retry_later(self, topic: str, partition: int, attempt: int) -> None:
        loop = asyncio.get_running_loop()
        # Kept referenced until done (the loop holds only weak references to tasks).
        tasks: set[asyncio.Task[None]] = self.__dict__.setdefault("_reassign_retries", set())

        def start() -> None:
            task = loop.create_task(self._complete_reassignment(topic, partition, attempt))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        loop.call_later(RETRY_S, start)

    async def reassign_partitions(
        self, reassignments: Sequence[Reassignment], throttle: int
    ) -> dict[tuple[str, int], PartitionState]:
        """Start the reassignments (all or none) and answer the partitions' new states."""
        self._check_leader()

        def publish(res: ReassignResult) -> None:
            self._publish(res.change)

        result = await self._write(
            lambda now: start_reassignments(self.cluster, reassignments, throttle, now), publish
        )
        for (topic, partition), state in result.states.items():
            log.info(
                "%s/%d: reassignment to %s started (adding %s, removing %s, throttle %d B/s)",
                topic,
                partition,
                list(state.target),
                list(state.adding),
                list(state.removing),
                state.throttle,
            )
        return result.states

    async def cancel_reassignments(
        self, keys: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], PartitionState]:
        """Cancel the reassignments in progress of ``keys`` (all or none): each partition goes back to its
        original replicas, the added ones are removed. Answers the partitions' new states."""
        self._check_leader()

        def publish(res: ReassignResult) -> None:
            self._publish(res.change)

        result = await self._write(lambda _now: cancel_reassignments(self.cluster, keys), publish)
        for (topic, partition), state in result.states.items():
            log.info(
                "%s/%d: reassignment cancelled: replicas %s again, leader %d at leader epoch %d",
                topic,
                partition,
                list(state.replicas),
                state.leader,
                state.leader_epoch,
            )
        return result.states

    async def _complete_reassignment(self, topic: str, partition: int, attempt: int = 0) -> None:
        """Complete ``topic/partition``'s reassignment if its added replicas are all in sync. A failed
        write is retried in the background (bounded), never failing the caller's own request: the ISR
        change that triggered it is written already. A coordinator that lost its term stops; the next
        term completes it at its start."""

        def publish(res: ReassignResult) -> None:
            self._publish(res.change)

        try:
            result = await self._write(
                lambda _now: complete_reassignment(self.cluster, topic, partition), publish
            )
        except NotCoordinator:
            return
        except SluiceError as err:
            if attempt >= RETRIES:
                log.error("%s/%d: reassignment not completed (%s); a new term will", topic, partition, err)
                return
            log.warning(
                "%s/%d: completing the reassignment failed (%s); again in %gs", topic, partition, err, RETRY_S
            )
            self._retry_later(topic, partition, attempt + 1)
            return
        for (name, p), state in result.states.items():
            log.info(
                "%s/%d: reassignment complete: replicas %s, leader %d at leader epoch %d",
                name,
                p,
                list(state.replicas),
                state.leader,
                state.leader_epoch,
            )

    async def _complete_pending_reassignments(self) -> None:
        """At the start of a term: complete every reassignment whose added replicas are all in sync (the
        previous term wrote the ISR change but not the completion)."""
        ready = [(t, p) for t, p, state in reassigning(self.cluster) if completed(state) is not None]
        for topic, partition in ready:
            await self._complete_reassignment(topic, partition)
