"""The coordinator's leadership moves of live brokers: controlled shutdown, preferred-leader elections (on
demand and automatic). The decisions are pure (``cluster/leadership.py``); this layer persists them, pushes
them, and waits for the replicas to have them before answering. docs/replication.md, "Controlled shutdown"
and "Preferred leaders".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

from sluice.common.timeouts import within
from sluice.coordinator.broker_updates import PushOutcome
from sluice.coordinator.cluster.elections import ElectionResult
from sluice.coordinator.cluster.isr import AlterPartitionResult, IsrProposal, alter_partition
from sluice.coordinator.cluster.leadership import (
    ShutdownResult,
    elect_preferred,
    imbalanced_brokers,
    shut_down_broker,
)
from sluice.coordinator.cluster.recovery import RecoveryPlan, plan_recovery, recover_partition
from sluice.coordinator.cluster.replication import PartitionState
from sluice.coordinator.cluster.unclean import LogReport, remove_unfit
from sluice.coordinator.reassignments import CoordinatorReassignments
from sluice.coordinator.records import Result
from sluice.coordinator.topic_acks import wait_for_brokers
from sluice.errors import FencedMemberEpoch, IneligibleReplica, SluiceError, UnknownMember

log = logging.getLogger(__name__)

#: After an ISR expansion that lets a preferred replica lead again, the automatic rebalance waits this
#: long, so the partitions of a returning broker that catch up together move in one write.
REBALANCE_DEBOUNCE_S = 0.2


class CoordinatorLeadership(CoordinatorReassignments):
    """Controlled shutdown and preferred leaders (the service is the next class in the chain)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Brokers in a controlled shutdown -> their broker epoch: never elected, never added back to
        #: an ISR, until they register again (a new process) or their epoch changes.
        self._shutting: dict[int, int] = {}
        self._rebalance_wake = asyncio.Event()
        #: Per broker, the logs of replicated partitions it listed at its last registration to this
        #: coordinator: an operator recovery's candidates where the persisted pool has no entry (a replica
        #: back after a clean shutdown). Memory only: a new term learns them as brokers register again.
        self._registered_logs: dict[int, dict[tuple[str, int], LogReport]] = {}

    def _remember_logs(self, broker_id: int, logs: Iterable[LogReport]) -> None:
        kept = {}
        for r in logs:
            record = self.cluster.topics.get(r.topic)
            if record is None or record.topic_id != r.topic_id or not 0 <= r.partition < record.partitions:
                continue
            replicas = record.states[r.partition].replicas
            if len(replicas) > 1 and broker_id in replicas:
                kept[(r.topic, r.partition)] = r
        self._registered_logs[broker_id] = kept

    # ---- ISR changes ---------------------------------------------------------------------------------

    async def alter_partition(self, proposal: IsrProposal) -> PartitionState:
        """A leader's ISR change (cluster/isr.py): checked, persisted with the next partition epoch,
        pushed to the partition's replicas; answers the partition's state."""

        def publish(res: AlterPartitionResult) -> None:
            self._publish(res.change)

        def alter(_now: int) -> Result[AlterPartitionResult]:
            record = self.cluster.topics.get(proposal.topic)
            if record is not None and 0 <= proposal.partition < record.partitions:
                self._check_eligible(proposal, record.states[proposal.partition].isr)
            return alter_partition(self.cluster, proposal)

        result = await self._write(alter, publish)
        if result.change is not None:
            self._isr_changed(result.state)
            log.info(
                "%s/%d: ISR %s at partition epoch %d (proposed by leader %d)",
                proposal.topic,
                proposal.partition,
                list(result.state.isr),
                result.state.partition_epoch,
                proposal.leader_id,
            )
        if result.state.reassigning:
            await self._complete_reassignment(proposal.topic, proposal.partition)
        return result.state

    # ---- unfit replicas: an unclean restart, damage found while leading ------------------------------

    async def replicas_unfit(self, broker_id: int, reports: Collection[LogReport], *, unclean: bool) -> None:
        """KIP-966 (cluster/unclean.py): after an unclean restart (``unclean``), ``broker_id`` leaves the
        ISR and ELR of every replicated partition it holds, or, as their last eligible replica, gives way
        to the longest reported log; after damage found while leading, of the ``reports``' partitions
        only, and it stays where no other eligible replica exists."""
        keyed = {(r.topic, r.partition): r for r in reports}
        only = None if unclean else set(keyed)
        if not any(
            broker_id in s.replicas and len(s.replicas) > 1
            for t in self.cluster.topics.values()
            for s in t.states
        ):
            return  # a new broker (an empty data directory has no marker either): nothing to take it out of
        why = f"broker {broker_id} " + (
            "restarted after an unclean shutdown" if unclean else "found damaged batches in its log"
        )
        log.warning("%s: out of the in-sync and eligible replicas until it catches up", why)

        async def run() -> None:
            await self._elect_now(
                why,
                lambda now: remove_unfit(self.cluster, broker_id, keyed, now, only=only, recover=unclean),
            )

        term = self._term
        if term is not None and not term.opened.is_set():
            # While this term's view is rebuilt, elections wait (rebuilding.py); this one goes first, so
            # no deferred election (of a broker that expired meanwhile) can pick the unfit broker.
            term.deferred.insert(0, run)
        else:
            await run()

    # ---- operator recovery -------------------------------------------------------------------------

    async def recover_partition(self, topic: str, partition: int, *, dry_run: bool) -> RecoveryPlan:
        """``sluice topic recover`` (cluster/recovery.py): elect the most complete live replica of an
        offline partition whose last eligible replicas are gone; ``dry_run`` only plans. Answers once
        the replicas applied it (bounded)."""
        self._check_leader()
        if dry_run:
            return plan_recovery(self.cluster, topic, partition, self._clock.now_ms(), self._registered_logs)
        acks: dict[int, asyncio.Future[PushOutcome]] = {}

        def publish(res: tuple[RecoveryPlan, ElectionResult]) -> None:
            acks.update(self._publish(res[1].change))

        plan, election = await self._write(
            lambda now: recover_partition(self.cluster, topic, partition, now, self._registered_logs), publish
        )
        log.error(
            "%s/%d: OPERATOR RECOVERY: eligible replica(s) %s declared gone; elected broker %d at leader "
            "epoch %d (what they held beyond its log is lost)",
            topic,
            partition,
            list(plan.missing),
            plan.leader,
            plan.leader_epoch,
        )
        self._metrics.leader_elections.labels("recovery").inc()
        if election.change is not None:
            await wait_for_brokers(acks, self._ack_wait_s(1), election.change.affected)
        return plan

    # ---- controlled shutdown -----------------------------------------------------------------------

    async def controlled_shutdown(self, broker_id: int, broker_epoch: int) -> ShutdownResult:
        """Move every leadership of ``broker_id`` to another ISR member and take it out of the ISRs;
        answer once the replicas applied it (bounded), with the partitions it still leads (no other
        eligible replica) and how many of those another live replica may still take. The broker asks
        again until none remain, none may move, or its own timeout passes."""
        self._check_leader()
        record = self.cluster.brokers.get(broker_id)
        if record is None:
            raise UnknownMember(f"broker {broker_id} is not registered with this coordinator")
        if record.broker_epoch != broker_epoch:
            raise FencedMemberEpoch(
                f"broker {broker_id} epoch {broker_epoch} is not the current {record.broker_epoch}"
            )
        self._shutting[broker_id] = broker_epoch
        shutting = self._shutting_now()
        result = await self._move(
            f"controlled shutdown of broker {broker_id}",
            "controlled",
            lambda now: shut_down_broker(self.cluster, broker_id, shutting, now),
        )
        if result.remaining:
            log.warning(
                "controlled shutdown of broker %d: %d partition(s) have no other eligible replica and stay "
                "led by it",
                broker_id,
                len(result.remaining),
            )
        return result

    def _shutting_now(self) -> set[int]:
        """The brokers in a controlled shutdown whose epoch is still current (a broker that registered
        again, or was forgotten, is not shutting down any more)."""
        for b, epoch in list(self._shutting.items()):
            current = self.cluster.brokers.get(b)
            if current is None or current.broker_epoch != epoch:
                del self._shutting[b]
        return set(self._shutting)

    def _check_eligible(self, proposal: IsrProposal, current: Collection[int]) -> None:
        """KIP-841: a broker in a controlled shutdown is not added back to an ISR (its follower fetches
        continue until it stops, and a leader would otherwise see it caught up)."""
        shutting = self._shutting_now()
        joining = [r for r in proposal.new_isr if r in shutting and r not in current]
        if joining:
            raise IneligibleReplica(
                f"{proposal.topic}/{proposal.partition}: broker(s) {joining} are shutting down and may not "
                "join the in-sync replicas"
            )

    # ---- preferred leaders -------------------------------------------------------------------------

    async def elect_leaders(self, topics: Collection[str]) -> tuple[tuple[str, int, int], ...]:
        """On demand (``sluice topic elect-leaders``): every partition of ``topics`` (all when empty)
        whose preferred replica is eligible gets it as leader. Answers (topic, partition, leader) moved."""
        self._check_leader()
        for t in topics:
            self.cluster.describe_topic(t, self._clock.now_ms())  # UNKNOWN_TOPIC for a wrong name
        wanted = set(topics) or None
        excluded = self._shutting_now()
        result = await self._move(
            "preferred leader election",
            "preferred",
            lambda now: _as_shutdown(elect_preferred(self.cluster, now, excluded, wanted)),
        )
        return result.election.leaders

    def _isr_changed(self, state: PartitionState) -> None:
        """After an ISR change: a preferred replica back in the ISR may lead again (the automatic
        rebalance looks soon)."""
        if state.replicas and state.leader != state.replicas[0] and state.replicas[0] in state.isr:
            self._rebalance_wake.set()

    async def _rebalance_loop(self) -> None:
        """Kafka's ``auto.leader.rebalance.enable``: when woken by an ISR expansion, and every
        ``leader_imbalance_check_interval_ms``, elect the preferred replicas of the brokers above the
        imbalance percentage."""
        settings = self.cluster.settings
        interval = settings.leader_imbalance_check_interval_ms / 1000
        while True:
            try:
                await within(self._rebalance_wake.wait(), interval)
                await asyncio.sleep(REBALANCE_DEBOUNCE_S)
            except TimeoutError:
                pass
            self._rebalance_wake.clear()
            excluded = self._shutting_now()
            now = self._clock.now_ms()
            percentage = settings.leader_imbalance_per_broker_percentage
            brokers = imbalanced_brokers(self.cluster, now, percentage, excluded)
            if not brokers:
                continue
            log.info("leader imbalance on broker(s) %s: electing preferred leaders", sorted(brokers))
            try:
                await self._rebalance(excluded, brokers)
            except SluiceError as err:
                log.warning("automatic preferred leader election failed: %s", err)

    async def _rebalance(self, excluded: set[int], brokers: set[int]) -> None:
        await self._move(
            "automatic preferred leader election",
            "preferred",
            lambda now: _as_shutdown(elect_preferred(self.cluster, now, excluded, brokers=brokers)),
        )

    # ---- the shared write path ----------------------------------------------------------------------

    async def _move(
        self, why: str, kind: str, plan: Callable[[int], Result[ShutdownResult]]
    ) -> ShutdownResult:
        """Persist and push a leadership move, then wait (bounded) until the affected brokers applied it:
        the new leaders serve when this returns."""
        acks: dict[int, asyncio.Future[PushOutcome]] = {}

        def publish(res: ShutdownResult) -> None:
            acks.update(self._publish(res.election.change))

        result = await self._write(plan, publish)
        change = result.election.change
        if change is not None:
            await wait_for_brokers(acks, self._ack_wait_s(len(result.election.leaders)), change.affected)
        for topic, partition, leader in result.election.leaders:
            log.info("%s/%d: %s, leader now %d", topic, partition, why, leader)
            self._metrics.leader_elections.labels(kind).inc()
        return result


def _as_shutdown(result: Result[ElectionResult]) -> Result[ShutdownResult]:
    return Result(ShutdownResult(result.response, ()), result.records)
