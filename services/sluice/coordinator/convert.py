"""Protobuf <-> domain conversions for the coordinator (the only module besides the servicer and the broker
notifier that knows the wire types)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluice.coordinator.cluster.model import (
    BrokerUpdate,
    Endpoint,
    MetadataView,
    PartitionRef,
    PartitionView,
    TopicConfig,
    TopicView,
)
from sluice.coordinator.cluster.rebuild import MAX_REPORTS, EpochReport
from sluice.coordinator.cluster.replication import ReplicationSpec
from sluice.coordinator.cluster.unclean import LogReport
from sluice.coordinator.groups.lag import LagRow
from sluice.coordinator.groups.model import (
    AssignedPartition,
    ConflictPolicy,
    GroupConfig,
    GroupDescription,
    GroupState,
    GroupSummary,
    HeartbeatRequest,
    HeartbeatResponse,
    MessageModel,
)
from sluice.errors import InvalidArgument, InvalidRequest
from sluice.v1 import broker_pb2, coordinator_pb2


def endpoint_from_proto(msg: coordinator_pb2.Endpoint, present: bool, what: str) -> Endpoint:
    if not present:
        raise InvalidRequest(f"{what}: endpoint is required")
    return Endpoint(msg.host, msg.port, msg.wire_port)


def endpoint_to_proto(ep: Endpoint) -> coordinator_pb2.Endpoint:
    return coordinator_pb2.Endpoint(host=ep.host, port=ep.port, wire_port=ep.wire_port)


def topic_config_from_proto(msg: broker_pb2.TopicConfig) -> TopicConfig:
    return TopicConfig(
        retention_ms=msg.retention_ms,
        retention_bytes=msg.retention_bytes,
        segment_bytes=msg.segment_bytes,
        segment_ms=msg.segment_ms,
        max_batch_bytes=msg.max_batch_bytes,
    )


def topic_config_to_proto(config: TopicConfig) -> broker_pb2.TopicConfig:
    return broker_pb2.TopicConfig(
        retention_ms=config.retention_ms,
        retention_bytes=config.retention_bytes,
        segment_bytes=config.segment_bytes,
        segment_ms=config.segment_ms,
        max_batch_bytes=config.max_batch_bytes,
    )


def replication_spec_from_proto(msg: coordinator_pb2.CreateTopicRequest) -> ReplicationSpec:
    return ReplicationSpec(msg.replication_factor, msg.min_insync_replicas, msg.unclean_leader_election)


def _partition_to_proto(p: PartitionView) -> coordinator_pb2.PartitionDescription:
    state = p.state
    if state is None or state.is_single:
        # One replica at epoch 0 (every unreplicated topic): the fields of before replication only, so
        # Metadata of such topics stays the size and cost it was (the SDK reads no replicas as this).
        return coordinator_pb2.PartitionDescription(
            partition=p.partition, broker_id=p.broker_id, dispatcher_id=p.dispatcher_id
        )
    return coordinator_pb2.PartitionDescription(
        partition=p.partition,
        broker_id=p.broker_id,
        dispatcher_id=p.dispatcher_id,
        replicas=state.replicas,
        isr=state.isr,
        leader_epoch=state.leader_epoch,
        partition_epoch=state.partition_epoch,
        elr=state.elr,
        adding_replicas=state.adding,
        removing_replicas=state.removing,
        throttle_bytes_per_second=state.throttle,
    )


def topic_to_proto(topic: TopicView) -> coordinator_pb2.TopicDescription:
    return coordinator_pb2.TopicDescription(
        name=topic.name,
        topic_id=topic.topic_id,
        partitions=[_partition_to_proto(p) for p in topic.partitions],
        config=topic_config_to_proto(topic.config),
        created_ms=topic.created_ms,
        replication_factor=topic.replication.factor,
        min_insync_replicas=topic.replication.min_insync_replicas,
        unclean_leader_election=topic.replication.unclean_leader_election,
    )


def _assignment(ref: PartitionRef) -> broker_pb2.PartitionAssignment:
    out = broker_pb2.PartitionAssignment(
        topic=ref.topic,
        topic_id=ref.topic_id,
        partition=ref.partition,
        config=topic_config_to_proto(ref.config),
        min_insync_replicas=ref.min_insync_replicas,
    )
    # One replica at epoch 0 (every unreplicated partition) is sent as before replication: the receiving
    # broker, its only replica, leads, which is what an assignment without replicas means to it.
    if ref.state is not None and not ref.state.is_single:
        out.leader = ref.state.leader
        out.leader_epoch = ref.state.leader_epoch
        out.partition_epoch = ref.state.partition_epoch
        out.replicas.extend(ref.state.replicas)
        out.isr.extend(ref.state.isr)
        out.throttle_bytes_per_second = ref.state.throttle
    return out


def broker_update_to_proto(
    update: BrokerUpdate, controller_epoch: int = 0
) -> broker_pb2.UpdatePartitionsRequest:
    """``controller_epoch``: the coordinator's term (its fencing epoch), which brokers never let go
    backwards (docs/replication.md, "Roles on the broker")."""
    return broker_pb2.UpdatePartitionsRequest(
        metadata_version=update.metadata_version,
        full=update.full,
        assign=[_assignment(r) for r in update.assign],
        remove=[_assignment(r) for r in update.remove],
        controller_epoch=controller_epoch,
    )


def metadata_to_proto(
    view: MetadataView, coordinator: Endpoint | None, offset_store: Endpoint | None
) -> coordinator_pb2.MetadataResponse:
    response = coordinator_pb2.MetadataResponse(
        brokers=[
            coordinator_pb2.BrokerDescription(
                broker_id=b.broker_id, endpoint=endpoint_to_proto(b.endpoint), alive=b.alive, rack=b.rack
            )
            for b in view.brokers
        ],
        dispatchers=[
            coordinator_pb2.DispatcherDescription(
                dispatcher_id=d.dispatcher_id, endpoint=endpoint_to_proto(d.endpoint), alive=d.alive
            )
            for d in view.dispatchers
        ],
        topics=[topic_to_proto(t) for t in view.topics],
        unknown_topics=list(view.unknown_topics),
        metadata_version=view.metadata_version,
    )
    if coordinator is not None:
        response.coordinator.CopyFrom(endpoint_to_proto(coordinator))
    if offset_store is not None:
        response.offset_store.CopyFrom(endpoint_to_proto(offset_store))
    return response


# ---- consumer groups ---------------------------------------------------------------------------------

_MODELS = {
    coordinator_pb2.MESSAGE_MODEL_CLUSTERING: MessageModel.CLUSTERING,
    coordinator_pb2.MESSAGE_MODEL_BROADCASTING: MessageModel.BROADCASTING,
}
_MODELS_BACK = {v: k for k, v in _MODELS.items()}


def heartbeat_from_proto(msg: coordinator_pb2.GroupHeartbeatRequest) -> HeartbeatRequest:
    model = _MODELS.get(msg.message_model)
    if model is None:
        raise InvalidArgument(f"unknown message_model {msg.message_model}: use clustering or broadcasting")
    return HeartbeatRequest(
        group=msg.group,
        member_id=msg.member_id,
        member_epoch=msg.member_epoch,
        instance_id=msg.instance_id,
        subscription=dict(msg.subscription),
        assignor=msg.assignor,
        message_model=model,
        owned=frozenset((tp.topic, tp.partition) for tp in msg.owned),
        rebalance_timeout_ms=msg.rebalance_timeout_ms,
        session_timeout_ms=msg.session_timeout_ms,
        client_id=msg.client_id,
    )


def _assigned(parts: Iterable[AssignedPartition]) -> list[coordinator_pb2.AssignedPartition]:
    return [
        coordinator_pb2.AssignedPartition(
            topic=a.topic, partition=a.partition, filter=a.filter, track=a.track
        )
        for a in parts
    ]


def heartbeat_to_proto(response: HeartbeatResponse) -> coordinator_pb2.GroupHeartbeatResponse:
    out = coordinator_pb2.GroupHeartbeatResponse(
        member_id=response.member_id,
        member_epoch=response.member_epoch,
        heartbeat_interval_ms=response.heartbeat_interval_ms,
    )
    if response.error is not None:
        out.error.CopyFrom(response.error.to_proto())
    if response.assignment is not None:
        out.assignment.partitions.extend(_assigned(response.assignment))
    return out


def group_config_from_proto(msg: coordinator_pb2.GroupConfig) -> tuple[GroupConfig, bool]:
    """The config and whether it sets the conflict policy (empty fields leave the current value)."""
    policy = ConflictPolicy.parse(msg.conflict_policy) if msg.conflict_policy else ConflictPolicy.REJECT
    for name in ("session_timeout_ms", "heartbeat_interval_ms", "rebalance_timeout_ms"):
        if getattr(msg, name) < 0:
            raise InvalidArgument(
                f"group config {name} must be >= 0 (0 = unchanged), got {getattr(msg, name)}"
            )
    config = GroupConfig(
        policy, msg.assignor, msg.session_timeout_ms, msg.heartbeat_interval_ms, msg.rebalance_timeout_ms
    )
    return config, bool(msg.conflict_policy)


def group_config_to_proto(config: GroupConfig) -> coordinator_pb2.GroupConfig:
    return coordinator_pb2.GroupConfig(
        conflict_policy=config.conflict_policy.value,
        assignor=config.assignor,
        session_timeout_ms=config.session_timeout_ms,
        heartbeat_interval_ms=config.heartbeat_interval_ms,
        rebalance_timeout_ms=config.rebalance_timeout_ms,
    )


def group_summary_to_proto(summary: GroupSummary) -> coordinator_pb2.GroupSummary:
    return coordinator_pb2.GroupSummary(
        group=summary.group, state=summary.state.value, members=summary.members
    )


def describe_group_to_proto(
    group: str,
    description: GroupDescription | None,
    rows: Sequence[LagRow],
    times: Sequence[tuple[int, int] | None],
) -> coordinator_pb2.DescribeGroupResponse:
    """``times``: per row (ms behind, first unconsumed timestamp), None when unknown."""
    lag = [
        coordinator_pb2.PartitionLag(
            topic=r.topic,
            partition=r.partition,
            track=r.track,
            committed=r.committed,
            high_watermark=r.high_watermark,
            lag=r.lag,
            member_id=r.member_id,
            lag_ms=t[0] if t is not None else -1,
            first_unconsumed_timestamp=t[1] if t is not None else -1,
        )
        for r, t in zip(rows, times, strict=True)
    ]
    if description is None:
        return coordinator_pb2.DescribeGroupResponse(
            group=group, state=GroupState.EMPTY.value, config=group_config_to_proto(GroupConfig()), lag=lag
        )
    return coordinator_pb2.DescribeGroupResponse(
        group=description.group,
        state=description.state.value,
        group_epoch=description.group_epoch,
        config=group_config_to_proto(description.config),
        members=[
            coordinator_pb2.MemberDescription(
                member_id=m.member_id,
                instance_id=m.instance_id,
                client_id=m.client_id,
                member_epoch=m.member_epoch,
                subscription=dict(m.subscription),
                assigned=_assigned(m.assigned),
                pending_revocation=_assigned(m.pending_revocation),
            )
            for m in description.members
        ],
        lag=lag,
        conflicts=list(description.conflicts),
        tracks=[
            coordinator_pb2.TrackBinding(
                topic=b.topic,
                filter=b.filter,
                track=b.track,
                members=b.members,
                idle_since_ms=b.idle_since_ms,
                source_track=b.source_track,
                inherited_filter=b.inherited_filter,
                since_ms=b.since_ms,
                handover_offsets=dict(b.handover_offsets),
            )
            for b in description.bindings
        ],
    )


def reports_from_proto(
    reporter: int, reports: Iterable[coordinator_pb2.PartitionEpochReport]
) -> tuple[EpochReport, ...]:
    """A heartbeat's ``epochs_ahead`` (at most ``MAX_REPORTS``: a broker sends no more)."""
    return tuple(
        EpochReport(
            reporter,
            r.topic,
            r.topic_id,
            r.partition,
            r.leader_epoch,
            r.partition_epoch,
            r.leader,
            tuple(r.replicas),
            tuple(r.isr),
        )
        for r, _ in zip(reports, range(MAX_REPORTS), strict=False)
    )


def log_reports_from_proto(reports: Iterable[coordinator_pb2.PartitionLogReport]) -> tuple[LogReport, ...]:
    """A registration's ``logs`` or a heartbeat's ``damaged`` (cluster/unclean.py)."""
    return tuple(
        LogReport(r.topic, r.topic_id, r.partition, r.last_leader_epoch, r.log_end_offset, r.damaged)
        for r in reports
    )
