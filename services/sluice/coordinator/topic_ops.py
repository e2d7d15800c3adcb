"""Topic creation, growth, alteration and deletion, under the cardinality limits and the partition mutation
quota (``limits.py``): a link of the coordinator's chain of classes (service.py), between the leadership
duties and the service itself.

The limits are checked inside the fenced write, against the state the write sees. The quota is keyed by
the caller (``who``: the principal, or the peer host when anonymous; the servicer says): a request is
refused while its bucket is in debt, and what it mutated is taken once it succeeded (KIP-599).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from sluice.coordinator.broker_updates import PushOutcome
from sluice.coordinator.cluster.model import CreateTopicResult, DeleteTopicResult, TopicConfig, TopicView
from sluice.coordinator.cluster.replication import DEFAULT_SPEC, ReplicationSpec
from sluice.coordinator.cluster.replication_factor import change_replication_factor
from sluice.coordinator.cluster.repush import repush_removals, repush_topic
from sluice.coordinator.groups.tracks import topic_deleted
from sluice.coordinator.leadership import CoordinatorLeadership
from sluice.coordinator.limits import CoordinatorLimits, PartitionMutationQuota, check_new_partitions
from sluice.coordinator.records import Result
from sluice.coordinator.topic_acks import Incomplete, settle, wait_for_brokers
from sluice.errors import SluiceError

log = logging.getLogger(__name__)

__all__ = ["CoordinatorTopics"]


class CoordinatorTopics(CoordinatorLeadership):
    """Create, grow, alter and delete topics (the service's topic half)."""

    #: Cardinality limits and the partition mutation quota (limits.py); ``set_limits`` replaces them
    #: (``CoordinatorService.from_config``). The quota is made per instance on first use.
    limits: CoordinatorLimits = CoordinatorLimits()
    _mutations: PartitionMutationQuota | None = None

    _group_creations: PartitionMutationQuota | None = None

    def set_limits(self, limits: CoordinatorLimits) -> None:
        self.limits = limits
        self._mutations = PartitionMutationQuota(
            limits.partition_mutations_per_second, limits.partition_mutation_burst
        )
        self._group_creations = PartitionMutationQuota(
            limits.group_creations_per_second, limits.group_creation_burst
        )

    def _mutation_quota(self) -> PartitionMutationQuota:
        if self._mutations is None:
            self.set_limits(self.limits)
        assert self._mutations is not None
        return self._mutations

    def _group_creation_quota(self) -> PartitionMutationQuota:
        self._mutation_quota()
        assert self._group_creations is not None
        return self._group_creations

    def _partition_counts(self) -> list[int]:
        return [t.partitions for t in self.cluster.topics.values()]

    async def create_topic(
        self,
        name: str,
        partitions: int,
        config: TopicConfig,
        spec: ReplicationSpec = DEFAULT_SPEC,
        *,
        who: str | None = None,
    ) -> tuple[TopicView, tuple[SluiceError, ...]]:
        """Create, persist, then wait (bounded) until the hosting brokers acknowledged the new partitions,
        so that a produce right after this returns finds them. Returns the topic and the brokers that did
        not answer (a degraded success); a broker that answered it could not apply the change raises
        BROKER_UPDATE_FAILED, and a retry with the same spec completes the creation (topic_acks.py)."""
        topic_id = uuid.uuid4().hex
        acks: dict[int, asyncio.Future[PushOutcome]] = {}

        def create(now_ms: int) -> Result[CreateTopicResult]:
            existing = self.cluster.topics.get(name)
            retry = self._incomplete.lookup(name, "create")
            if (
                existing is not None
                and retry is not None
                and (retry.topic_id, retry.partitions) == (existing.topic_id, partitions)
                and existing.partitions == partitions
                and existing.config == config
                and existing.replication
                == spec.resolve(self.cluster.settings.default_replication_factor, name)
            ):
                log.info("create topic %s again: pushing its partitions to the brokers again", name)
                return repush_topic(self.cluster, name, now_ms)
            if existing is None:
                check_new_partitions(
                    self.limits,
                    self._partition_counts(),
                    new_topic=True,
                    partitions=partitions,
                    added=partitions,
                )
            return self.cluster.create_topic(name, partitions, config, topic_id, now_ms, spec)

        quota = self._mutation_quota()
        quota.check(who, self._clock.now_ms(), f"create topic {name}")
        result = await self._write(create, lambda res: acks.update(self._publish(res.change)))
        quota.record(who, partitions, self._clock.now_ms())
        log.info("created topic %s (%d partitions, id %s)", name, partitions, result.topic.topic_id)
        return result.topic, await self._settle_create(f"create topic {name}", result, acks)

    async def add_partitions(
        self, name: str, partitions: int, *, who: str | None = None
    ) -> tuple[TopicView, tuple[SluiceError, ...]]:
        acks: dict[int, asyncio.Future[PushOutcome]] = {}
        added = 0

        def grow(now_ms: int) -> Result[CreateTopicResult]:
            existing = self.cluster.topics.get(name)
            retry = self._incomplete.lookup(name, "create")
            if (
                existing is not None
                and retry is not None
                and existing.partitions == partitions == retry.partitions
            ):
                log.info("add partitions to %s again: pushing its partitions to the brokers again", name)
                return repush_topic(self.cluster, name, now_ms)
            if existing is not None and partitions > existing.partitions:
                nonlocal added
                added = partitions - existing.partitions
                check_new_partitions(
                    self.limits, self._partition_counts(), new_topic=False, partitions=partitions, added=added
                )
            return self.cluster.add_partitions(name, partitions, now_ms)

        quota = self._mutation_quota()
        quota.check(who, self._clock.now_ms(), f"add partitions to {name}")
        result = await self._write(grow, lambda res: acks.update(self._publish(res.change)))
        quota.record(who, added, self._clock.now_ms())
        log.info("topic %s grown to %d partitions", name, partitions)
        return result.topic, await self._settle_create(f"add partitions to {name}", result, acks)

    async def alter_topic(
        self,
        name: str,
        min_insync_replicas: int,
        unclean_leader_election: bool | None,
        replication_factor: int = 0,
        throttle: int = 0,
    ) -> tuple[TopicView, tuple[SluiceError, ...]]:
        """Change a topic's replication settings and wait (bounded) for its replicas to be told; a retry
        of the same call pushes it again (every alter is a new version). A ``replication_factor`` (0:
        unchanged) starts a reassignment of every partition not at that factor (cluster/replication_factor.py)
        and answers once started, like ReassignPartitions."""
        acks: dict[int, asyncio.Future[PushOutcome]] = {}
        if replication_factor:
            self._check_leader()
            started = await self._write(
                lambda now: change_replication_factor(
                    self.cluster,
                    name,
                    replication_factor,
                    min_insync_replicas,
                    unclean_leader_election,
                    throttle,
                    now,
                ),
                lambda res: acks.update(self._publish(res.change)),
            )
            change = started.change
            topic = self.cluster.describe_topic(name, self._clock.now_ms())
        else:
            result = await self._write(
                lambda now: self.cluster.alter_topic(name, min_insync_replicas, unclean_leader_election, now),
                lambda res: acks.update(self._publish(res.change)),
            )
            change, topic = result.change, result.topic
        replication = topic.replication
        log.info(
            "topic %s altered: replication factor %d, min in-sync replicas %d, unclean leader election %s",
            name,
            replication.factor,
            replication.min_insync_replicas,
            replication.unclean_leader_election,
        )
        if change is None:
            return topic, ()
        wait_s = self._ack_wait_s(len(topic.partitions))
        failures = await wait_for_brokers(acks, wait_s, change.affected)
        return topic, settle(failures, f"alter topic {name}")

    async def _settle_create(
        self, what: str, result: CreateTopicResult, acks: dict[int, asyncio.Future[PushOutcome]]
    ) -> tuple[SluiceError, ...]:
        topic = result.topic
        wait_s = self._ack_wait_s(len(topic.partitions))
        failures = await wait_for_brokers(acks, wait_s, result.change.affected)
        incomplete = Incomplete("create", topic.topic_id, len(topic.partitions), topic.config, {})
        return self._incomplete.record(topic.name, failures, incomplete, what)

    async def delete_topic(self, name: str, *, who: str | None = None) -> tuple[SluiceError, ...]:
        """Delete; returns the brokers that did not answer, as ``create_topic``."""
        acks: dict[int, asyncio.Future[PushOutcome]] = {}
        quota = self._mutation_quota()
        quota.check(who, self._clock.now_ms(), f"delete topic {name}")
        deleting = self.cluster.topics.get(name)

        def delete(now_ms: int) -> Result[DeleteTopicResult]:
            retry = self._incomplete.lookup(name, "delete")
            if retry is not None and name not in self.cluster.topics:
                log.info("delete topic %s again: pushing its removals to the brokers again", name)
                return repush_removals(self.cluster, name, retry.removals)
            # The groups forget the topic's bindings in the same write as its tombstone and purge.
            deleted = self.cluster.delete_topic(name)
            forget = topic_deleted(self.groups.groups.values(), name, now_ms)
            return Result(deleted.response, (*deleted.records, *forget))

        result: DeleteTopicResult = await self._write(
            delete, lambda res: acks.update(self._publish(res.change))
        )
        log.info("deleted topic %s", name)
        quota.record(who, deleting.partitions if deleting is not None else 0, self._clock.now_ms())
        removed = sum(len(refs) for refs in result.change.remove.values())
        failures = await wait_for_brokers(acks, self._ack_wait_s(removed), result.change.affected)
        incomplete = Incomplete("delete", "", 0, TopicConfig(), result.change.remove)
        return self._incomplete.record(name, failures, incomplete, f"delete topic {name}")
