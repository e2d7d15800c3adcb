"""Administration: topics (coordinator), consumer groups (coordinator + offset store) and push
subscriptions (dispatchers)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sluice.client import reassign_admin, users
from sluice.client.acl_admin import AclAdmin
from sluice.client.consumer import group_admin, offset_reset
from sluice.client.consumer.group_admin import GroupConfigInfo, GroupDescription, GroupSummary
from sluice.client.consumer.offset_reset import OffsetResetRow, ResetTo
from sluice.client.metadata import TOPIC_CONFIG_KEYS, MetadataCache, TopicInfo, call_with_retry
from sluice.client.push import admin as push_admin
from sluice.client.push import sub_admin
from sluice.client.push.admin import SubscriptionInfo
from sluice.client.push.sub_admin import PeekedMessage, SubscriptionChange
from sluice.client.quota_admin import QuotaAdmin
from sluice.client.reassign_admin import Recovery
from sluice.client.rpc import call
from sluice.client.users import UserChange, UserInfo
from sluice.common.names import MAX_PARTITIONS, validate_topic
from sluice.common.peers import Peers
from sluice.common.units import parse_duration, parse_size
from sluice.errors import (
    InvalidArgument,
    InvalidPartitions,
    InvalidReplicationFactor,
    SluiceError,
    error_from_proto,
)
from sluice.security.scram import DEFAULT_ITERATIONS
from sluice.v1 import broker_pb2, common_pb2, coordinator_pb2

log = logging.getLogger(__name__)


def _unacknowledged(errors: Iterable[common_pb2.Error]) -> tuple[SluiceError, ...]:
    """A topic change's degraded part: brokers that did not acknowledge it in time (logged too)."""
    found = tuple(e for e in (error_from_proto(p) for p in errors) if e is not None)
    for err in found:
        log.warning("%s", err)
    return found


def _with_unacknowledged(info: TopicInfo, errors: Iterable[common_pb2.Error]) -> TopicInfo:
    found = _unacknowledged(errors)
    return dataclasses.replace(info, unacknowledged=found) if found else info


__all__ = ["Admin", "topic_config_to_proto"]


def topic_config_to_proto(config: Mapping[str, Any] | None) -> broker_pb2.TopicConfig:
    """A ``{"retention_ms": ..., ...}`` mapping as a TopicConfig; unknown keys are rejected.

    ``*_ms`` values may be ints (ms), ``timedelta`` or strings such as ``"7d"``;
    ``*_bytes`` values may be ints or strings such as ``"1GiB"``. 0 (or absent)
    means the broker default.
    """
    if not config:
        return broker_pb2.TopicConfig()
    unknown = sorted(set(config) - set(TOPIC_CONFIG_KEYS))
    if unknown:
        raise InvalidArgument(
            f"unknown topic setting(s) {', '.join(unknown)}; known: {', '.join(TOPIC_CONFIG_KEYS)}"
        )
    values: dict[str, int] = {}
    for key, raw in config.items():
        if isinstance(raw, bool):
            raise InvalidArgument(f"topic setting {key}: {raw!r} is not a number")
        if key.endswith("_ms"):
            if isinstance(raw, int):
                value = raw
            elif isinstance(raw, str | timedelta | float):
                value = int(parse_duration(raw).total_seconds() * 1000)
            else:
                raise InvalidArgument(f"topic setting {key}: {raw!r} is not a duration")
        else:
            if not isinstance(raw, int | str):
                raise InvalidArgument(f"topic setting {key}: {raw!r} is not a size")
            value = parse_size(raw)
        if value < 0:
            raise InvalidArgument(f"topic setting {key} must be >= 0, got {value}")
        values[key] = value
    try:
        return broker_pb2.TopicConfig(**values)
    except ValueError as exc:  # out of the int32/int64 range
        raise InvalidArgument(f"topic settings out of range: {exc}") from None


def _positive_or_default(what: str, value: int | None) -> int:
    """None -> 0 (the coordinator's default); else a positive int, checked here so the error names the
    argument."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        raise (InvalidReplicationFactor if what == "replication_factor" else InvalidArgument)(
            f"{what} must be a positive integer, got {value!r}"
        )
    return value


class Admin(AclAdmin, QuotaAdmin):
    """``client.admin``: topic, group, subscription, ACL and user operations (ACLs: ``acl_admin.py``;
    users: ``users.py``). Every call raises typed ``sluice.errors``."""

    def __init__(
        self, metadata: MetadataCache, request_timeout: float, channels: Peers | None = None
    ) -> None:
        self._metadata = metadata
        self._timeout = request_timeout
        self._channels = channels if channels is not None else Peers()

    def create_topic(
        self,
        name: str,
        partitions: int = 1,
        config: Mapping[str, Any] | None = None,
        *,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        unclean_leader_election: bool = False,
    ) -> TopicInfo:
        """Create a topic with ``partitions`` partitions, each on ``replication_factor`` brokers (None:
        the coordinator's default), placed across the live brokers (and racks).

        ``min_insync_replicas`` (None: min(2, factor)) is how many in-sync replicas an ``acks="all"``
        write needs; ``unclean_leader_election`` lets an out-of-sync replica lead when no in-sync one is
        left (it loses data; docs/replication.md).

        Raises InvalidTopic, InvalidPartitions, TopicAlreadyExists, InvalidArgument,
        InvalidReplicationFactor (more replicas than live brokers), and BrokerUpdateFailed when the
        topic was recorded but a broker could not create its partitions (the message names the broker
        and why): fix the cause and call again with the same arguments, which completes the creation
        (docs/coordinator.md).
        """
        validate_topic(name)
        if (
            isinstance(partitions, bool)
            or not isinstance(partitions, int)
            or not 1 <= partitions <= MAX_PARTITIONS
        ):
            raise InvalidPartitions(
                f"partitions must be an integer from 1 to {MAX_PARTITIONS}, got {partitions!r}"
            )
        request = coordinator_pb2.CreateTopicRequest(
            name=name,
            partitions=partitions,
            config=topic_config_to_proto(config),
            replication_factor=_positive_or_default("replication_factor", replication_factor),
            min_insync_replicas=_positive_or_default("min_insync_replicas", min_insync_replicas),
            unclean_leader_election=bool(unclean_leader_election),
        )
        # Not retried: a create whose answer was lost would come back as TopicAlreadyExists.
        resp = call(self._metadata.coordinator_stub().CreateTopic, request, self._timeout)
        self._metadata.invalidate(name)
        return _with_unacknowledged(TopicInfo.from_proto(resp.topic), resp.unacknowledged)

    def add_partitions(self, name: str, partitions: int) -> TopicInfo:
        """Grow ``name`` to ``partitions`` partitions (never shrinks; existing data stays put).

        Keyed records may map to other partitions afterwards, as in Kafka. Raises
        UnknownTopicOrPartition, InvalidPartitions, and BrokerUpdateFailed as ``create_topic`` does
        (a retry to the same count completes the growth).
        """
        validate_topic(name)
        if isinstance(partitions, bool) or not isinstance(partitions, int):
            raise InvalidPartitions(f"partitions must be an integer, got {partitions!r}")
        request = coordinator_pb2.AddPartitionsRequest(name=name, partitions=partitions)
        try:
            resp = call(self._metadata.coordinator_stub().AddPartitions, request, self._timeout)
        finally:
            self._metadata.invalidate(name)
        return _with_unacknowledged(TopicInfo.from_proto(resp.topic), resp.unacknowledged)

    def alter_topic(
        self,
        name: str,
        *,
        min_insync_replicas: int | None = None,
        unclean_leader_election: bool | None = None,
        replication_factor: int | None = None,
        throttle_bytes_per_second: int = 0,
    ) -> TopicInfo:
        """Change a topic's replication settings (None: unchanged); its replicas are told. A new
        ``replication_factor`` reassigns every partition to that many replicas (added ones catch up at
        ``throttle_bytes_per_second`` each; follow with ``describe_topic``). Raises
        UnknownTopicOrPartition, InvalidArgument (min in-sync replicas above the factor),
        InvalidReplicationFactor (above the live brokers), ReassignmentInProgress, and BrokerUpdateFailed
        as ``create_topic`` does (a retry of the same call completes it)."""
        validate_topic(name)
        request = coordinator_pb2.AlterTopicRequest(
            name=name,
            min_insync_replicas=_positive_or_default("min_insync_replicas", min_insync_replicas),
            replication_factor=_positive_or_default("replication_factor", replication_factor),
            throttle_bytes_per_second=throttle_bytes_per_second,
        )
        if unclean_leader_election is not None:
            if not isinstance(unclean_leader_election, bool):
                raise InvalidArgument(
                    f"unclean_leader_election must be True, False or None, got {unclean_leader_election!r}"
                )
            request.unclean_leader_election = unclean_leader_election
        try:
            resp = call(self._metadata.coordinator_stub().AlterTopic, request, self._timeout)
        finally:
            self._metadata.invalidate(name)
        return _with_unacknowledged(TopicInfo.from_proto(resp.topic), resp.unacknowledged)

    def elect_leaders(self, topics: Sequence[str] = ()) -> list[tuple[str, int, int]]:
        """Give each partition of ``topics`` (every topic when empty) back to its preferred replica (the
        first of its replicas) where that replica is live and in sync. Returns (topic, partition, leader)
        of the partitions that moved. docs/replication.md, "Preferred leaders"."""
        for name in topics:
            validate_topic(name)
        try:
            resp = call(
                self._metadata.coordinator_stub().ElectLeaders,
                coordinator_pb2.ElectLeadersRequest(topics=list(topics)),
                self._timeout,
            )
        finally:
            for name in topics:
                self._metadata.invalidate(name)
        return [(e.topic, e.partition, e.leader) for e in resp.elected]

    def list_topics(self) -> list[TopicInfo]:
        """Every topic, sorted by name."""
        resp = call_with_retry(
            lambda: call(
                self._metadata.coordinator_stub().ListTopics,
                coordinator_pb2.ListTopicsRequest(),
                self._timeout,
            ),
            self._timeout,
        )
        return sorted((TopicInfo.from_proto(t) for t in resp.topics), key=lambda t: t.name)

    def describe_topic(self, name: str) -> TopicInfo:
        """One topic; raises UnknownTopicOrPartition when it does not exist."""
        validate_topic(name)
        request = coordinator_pb2.DescribeTopicRequest(name=name)
        resp = call_with_retry(
            lambda: call(self._metadata.coordinator_stub().DescribeTopic, request, self._timeout),
            self._timeout,
        )
        return TopicInfo.from_proto(resp.topic)

    def delete_topic(self, name: str) -> tuple[SluiceError, ...]:
        """Delete a topic and its data; raises UnknownTopicOrPartition when it does not exist, and
        BrokerUpdateFailed when a broker did not remove its partitions (a retry pushes the removal again).
        Returns the brokers that did not acknowledge in time (BrokerNotAvailable each; usually none)."""
        validate_topic(name)
        request = coordinator_pb2.DeleteTopicRequest(name=name)
        try:
            resp = call(self._metadata.coordinator_stub().DeleteTopic, request, self._timeout)
        finally:
            self._metadata.invalidate(name)
        return _unacknowledged(resp.unacknowledged)

    def reassign_partitions(
        self, plan: Mapping[tuple[str, int], Sequence[int]], *, throttle_bytes_per_second: int = 0
    ) -> list[TopicInfo]:
        """Move partitions' replicas: ``plan`` maps (topic, partition) to its target replicas in preference
        order (as many as the topic's replication factor). The new replicas catch up as followers (each
        fetching at most ``throttle_bytes_per_second``, 0: unthrottled), and once all are in sync the
        replica list becomes the target and the replicas left out are deleted. Returns at once with the
        started states: progress shows in ``describe_topic`` (``adding_replicas``, ``removing_replicas``).
        All or none. Raises UnknownTopicOrPartition, InvalidArgument, InvalidReplicationFactor (a target
        of another size), BrokerNotAvailable (a target broker not live) and ReassignmentInProgress.
        docs/replication.md, "Reassignment"."""
        return reassign_admin.reassign_partitions(
            self._metadata, plan, throttle_bytes_per_second, self._timeout
        )

    def cancel_reassignments(self, partitions: Sequence[tuple[str, int]]) -> list[TopicInfo]:
        """Cancel the reassignments in progress of ``partitions`` (all or none): each goes back to its
        original replicas, the added ones deleted (InvalidArgument: none in progress, none in sync)."""
        return reassign_admin.cancel_reassignments(self._metadata, partitions, self._timeout)

    def recover_partition(self, topic: str, partition: int, *, dry_run: bool = False) -> Recovery:
        """Elect the most complete live replica of an offline partition whose last eligible replicas are
        gone (data loss: ``Recovery.missing``); ``dry_run``: only say who would. replication.md."""
        return reassign_admin.recover_partition(self._metadata, topic, partition, dry_run, self._timeout)

    # ---- consumer groups ------------------------------------------------------------------------

    def list_groups(self) -> list[GroupSummary]:
        """Every consumer group the coordinator knows, sorted by name."""
        return group_admin.list_groups(self._metadata, self._timeout)

    def describe_group(self, group: str) -> GroupDescription:
        """Members (subscriptions, assignment, pending revocations), conflicts, config, and
        committed offset + lag per partition and track. Raises UnknownGroup."""
        return group_admin.describe_group(self._metadata, group, self._timeout)

    def set_group_config(
        self,
        group: str,
        conflict_policy: str | None = None,
        assignor: str | None = None,
        *,
        session_timeout: timedelta | str | float | None = None,
        heartbeat_interval: timedelta | str | float | None = None,
        rebalance_timeout: timedelta | str | float | None = None,
    ) -> GroupConfigInfo:
        """Change a group's settings (None: unchanged): ``conflict_policy`` "reject" or
        "split", the assignor, and the timeouts it imposes on its members."""
        return group_admin.set_group_config(
            self._metadata,
            group,
            self._timeout,
            conflict_policy=conflict_policy,
            assignor=assignor,
            session_timeout=session_timeout,
            heartbeat_interval=heartbeat_interval,
            rebalance_timeout=rebalance_timeout,
        )

    def reset_offsets(
        self,
        group: str,
        topic: str,
        spec: str | int,
        partitions: Iterable[int] | None = None,
        *,
        track: str = "default",
        timestamp: bool = False,
    ) -> dict[int, int]:
        """Set the group's committed offsets of ``topic`` to "earliest", "latest", an offset or
        (``timestamp=True``) the first record at or after a time in ms; every partition unless
        ``partitions``. Only while the group has no live members (else GroupNotEmpty).
        Returns {partition: offset set}."""
        return group_admin.reset_offsets(
            self._channels,
            self._metadata,
            group,
            topic,
            spec,
            self._timeout,
            partitions=partitions,
            track=track,
            timestamp=timestamp,
        )

    def reset_group_offsets(
        self,
        group: str,
        to: ResetTo,
        topics: Mapping[str, Iterable[int] | None] | None = None,
        *,
        track: str = "default",
        execute: bool = False,
    ) -> list[OffsetResetRow]:
        """Preview (default) or, with ``execute=True``, apply a reset of ``group``'s committed offsets
        to ``to`` (``ResetTo.earliest()``, ``.latest()``, ``.offset(n)``, ``.datetime(dt)``,
        ``.duration("15m")``, ``.shift(-10)``). ``topics``: {topic: partitions, or None for all};
        None: every topic the group has committed offsets for. Each row says the committed offset
        before, the new one, and whether the target was clamped into the log. One atomic write,
        only while the group has no live members (GroupNotEmpty, also for a preview)."""
        return offset_reset.reset_group_offsets(
            self._channels,
            self._metadata,
            group,
            to,
            self._timeout,
            topics=topics,
            track=track,
            execute=execute,
        )

    def delete_group(self, group: str) -> int:
        """Delete ``group``: its state on the coordinator and its committed offsets on every track.
        Refused with GroupNotEmpty while it has members; UnknownGroup if there is nothing to delete.
        Returns the number of committed offsets deleted."""
        return group_admin.delete_group(self._metadata, group, self._timeout)

    def set_group_offsets(
        self, group: str, topic: str, offsets: Mapping[int, int], *, track: str = "default"
    ) -> dict[int, int]:
        """Set ``{partition: offset}`` exactly (through ResetOffsets, so only while the group
        has no live members: GroupNotEmpty otherwise). Partitions sharing an offset go in one
        atomic request; different offsets take one request each."""
        return group_admin.set_group_offsets(
            self._channels, self._metadata, group, topic, offsets, self._timeout, track=track
        )

    def group_offsets(
        self,
        group: str,
        partitions: Iterable[tuple[str, int]] | None = None,
        *,
        track: str = "default",
        member_id: str = "",
    ) -> dict[tuple[str, int], int]:
        """Committed offsets of ``group`` on ``track`` ({(topic, partition): offset}; a partition
        with nothing committed is absent). ``member_id``: a broadcasting member's own offsets."""
        return group_admin.fetch_group_offsets(
            self._channels,
            self._metadata,
            group,
            self._timeout,
            track=track,
            partitions=partitions,
            member_id=member_id,
        )

    # ---- push subscriptions ---------------------------------------------------------------------

    def list_subscriptions(self, topic: str | None = None) -> list[SubscriptionInfo]:
        """Push subscriptions (of ``topic``): type, consumers, backlog, last-active time. Durable ones
        are listed until deleted, idle or not."""
        return push_admin.list_subscriptions(self._channels, self._metadata, topic, self._timeout)

    def describe_subscription(self, topic: str, subscription: str) -> SubscriptionInfo:
        """One subscription with its consumers. Raises UnknownSubscription, UnknownTopicOrPartition."""
        return push_admin.describe_subscription(
            self._channels, self._metadata, topic, subscription, self._timeout
        )

    def reset_subscription(
        self,
        topic: str,
        subscription: str,
        to: str | int | datetime,
        *,
        partitions: Iterable[int] | None = None,
        force: bool = False,
    ) -> SubscriptionChange:
        """Move a durable subscription to ``to``: "earliest", "latest", an offset (clamped to the log,
        with a note per partition) or a time (an aware ``datetime`` or ISO 8601; naive means UTC; a
        future time is InvalidArgument). Everything at and after the new position is unacknowledged.
        Connected consumers: SubscriptionInUse, unless ``force`` (they reconnect at the new position)."""
        return sub_admin.reset_subscription(
            self._channels,
            self._metadata,
            topic,
            subscription,
            to,
            partitions=list(partitions) if partitions is not None else None,
            force=force,
            timeout=self._timeout,
        )

    def skip_subscription(
        self, topic: str, subscription: str, count: int, *, force: bool = False
    ) -> SubscriptionChange:
        """Acknowledge the next ``count`` messages (the ones ``peek_subscription(count)`` shows)."""
        return sub_admin.skip_subscription(
            self._channels, self._metadata, topic, subscription, count, force=force, timeout=self._timeout
        )

    def delete_subscription(
        self, topic: str, subscription: str, *, force: bool = False
    ) -> SubscriptionChange:
        """Delete a subscription and its stored positions. SubscriptionInUse while consumers are
        connected, unless ``force`` (their streams end with UnknownSubscription)."""
        return sub_admin.delete_subscription(
            self._channels, self._metadata, topic, subscription, force=force, timeout=self._timeout
        )

    def peek_subscription(self, topic: str, subscription: str, count: int = 1) -> list[PeekedMessage]:
        """The next ``count`` messages, without consuming or moving anything."""
        return sub_admin.peek_subscription(
            self._channels, self._metadata, topic, subscription, count, timeout=self._timeout
        )

    def list_parked_keys(self, topic: str, subscription: str) -> list[sub_admin.ParkedKeyInfo]:
        """Key_Shared keys parked after repeated failures (docs/poison-keys.md), oldest first."""
        return sub_admin.list_parked_keys(
            self._channels, self._metadata, topic, subscription, timeout=self._timeout
        )

    def unpark_key(self, topic: str, subscription: str, key: bytes) -> int:
        """Release a parked key: its messages go again, counted from 0. Returns how many."""
        return sub_admin.unpark_key(
            self._channels, self._metadata, topic, subscription, key, timeout=self._timeout
        )

    # ---- users (SCRAM; docs/security.md) ---------------------------------------------------------------

    def upsert_user(self, name: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> UserChange:
        """Create a user or set its password (ending its sessions). The SCRAM credential is computed
        here: the password never leaves this process."""
        return users.upsert_user(
            self._channels, self._metadata.bootstrap, name, password, iterations, self._timeout
        )

    def delete_user(self, name: str) -> UserChange:
        """Delete a user (ending its sessions); ``changed`` is False if there was none."""
        return users.delete_user(self._channels, self._metadata.bootstrap, name, self._timeout)

    def list_users(self) -> list[UserInfo]:
        return users.list_users(self._channels, self._metadata.bootstrap, self._timeout)
