"""The admin calls that move replicas: reassign partitions, cancel reassignments, recover an offline
partition (``Admin`` forwards to these). docs/replication.md, "Reassignment" and "Operator recovery"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sluice.client.metadata import MetadataCache, TopicInfo
from sluice.client.rpc import call
from sluice.common.names import validate_topic
from sluice.errors import InvalidArgument
from sluice.v1 import coordinator_pb2

__all__ = [
    "Recovery",
    "RecoveryCandidate",
    "cancel_reassignments",
    "reassign_partitions",
    "recover_partition",
]


def reassign_partitions(
    metadata: MetadataCache,
    plan: Mapping[tuple[str, int], Sequence[int]],
    throttle_bytes_per_second: int,
    timeout: float,
) -> list[TopicInfo]:
    if isinstance(throttle_bytes_per_second, bool) or not isinstance(throttle_bytes_per_second, int):
        raise InvalidArgument(
            f"throttle_bytes_per_second must be an integer, got {throttle_bytes_per_second!r}"
        )
    request = coordinator_pb2.ReassignPartitionsRequest(throttle_bytes_per_second=throttle_bytes_per_second)
    for (topic, partition), replicas in plan.items():
        validate_topic(topic)
        request.reassignments.add(topic=topic, partition=partition, replicas=list(replicas))
    return _send(metadata, request, [t for t, _ in plan], timeout)


def cancel_reassignments(
    metadata: MetadataCache, partitions: Sequence[tuple[str, int]], timeout: float
) -> list[TopicInfo]:
    request = coordinator_pb2.ReassignPartitionsRequest(cancel=True)
    for topic, partition in partitions:
        validate_topic(topic)
        request.reassignments.add(topic=topic, partition=partition)
    return _send(metadata, request, [t for t, _ in partitions], timeout)


def _send(
    metadata: MetadataCache,
    request: coordinator_pb2.ReassignPartitionsRequest,
    topics: Sequence[str],
    timeout: float,
) -> list[TopicInfo]:
    try:
        resp = call(metadata.coordinator_stub().ReassignPartitions, request, timeout)
    finally:
        for topic in topics:
            metadata.invalidate(topic)
    return [TopicInfo.from_proto(t) for t in resp.topics]


@dataclass(frozen=True)
class RecoveryCandidate:
    """A live replica's log as the controller last heard of it."""

    broker_id: int
    last_leader_epoch: int
    log_end_offset: int
    damaged: bool


@dataclass(frozen=True)
class Recovery:
    """What an operator recovery did (or, ``recovered`` False, would do)."""

    leader: int
    leader_epoch: int
    #: Every live replica with a known log, the chosen one first.
    candidates: tuple[RecoveryCandidate, ...]
    #: The last eligible replicas that are not back: what they held beyond the chosen log is lost.
    missing: tuple[int, ...]
    recovered: bool


def recover_partition(
    metadata: MetadataCache, topic: str, partition: int, dry_run: bool, timeout: float
) -> Recovery:
    validate_topic(topic)
    request = coordinator_pb2.RecoverPartitionRequest(topic=topic, partition=partition, dry_run=dry_run)
    try:
        resp = call(metadata.coordinator_stub().RecoverPartition, request, timeout)
    finally:
        metadata.invalidate(topic)
    return Recovery(
        resp.leader,
        resp.leader_epoch,
        tuple(
            RecoveryCandidate(c.broker_id, c.last_leader_epoch, c.log_end_offset, c.damaged)
            for c in resp.candidates
        ),
        tuple(resp.missing),
        resp.recovered,
    )
