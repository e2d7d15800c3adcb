"""The coordinator's reassignment calls (``cluster/reassign.py`` on the one write path): start partitions'
reassignments, and complete each once its added replicas are in sync. docs/replication.md, "Reassignment".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sluice.coordinator.cluster.reassign import (
    Reassignment,
    ReassignResult,
    complete_reassignment,
    completed,
    reassigning,
    start_reassignments,
)
from sluice.coordinator.cluster.replication import PartitionState
from sluice.coordinator.timers import CoordinatorTimers

log = logging.getLogger(__name__)

__all__ = ["CoordinatorReassignments"]


class CoordinatorReassignments(CoordinatorTimers):
    """Reassignment on the leading coordinator. Completion is driven by events, never polled: the ISR
    expansion that brings the last added replica in (``AlterPartition``) completes it in the next write,
    and a new term completes any whose completion the previous term did not write."""

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

    async def _complete_reassignment(self, topic: str, partition: int) -> None:
        def publish(res: ReassignResult) -> None:
            self._publish(res.change)

        result = await self._write(
            lambda _now: complete_reassignment(self.cluster, topic, partition), publish
        )
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
