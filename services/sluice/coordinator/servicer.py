"""``sluice.v1.Coordinator`` over gRPC: protobuf in, domain call, protobuf out. Nothing else.

Errors are raised as ``SluiceError``s; the shared interceptor maps them to a status and the
``sluice-error-code`` trailer. Heartbeat answers protocol refusals in its response's ``error`` field.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from grpc import aio

from sluice.coordinator.cluster.isr import IsrProposal
from sluice.coordinator.cluster.reassign import Reassignment
from sluice.coordinator.convert import (
    broker_update_to_proto,
    describe_group_to_proto,
    endpoint_from_proto,
    group_config_from_proto,
    group_config_to_proto,
    group_summary_to_proto,
    heartbeat_from_proto,
    heartbeat_to_proto,
    log_reports_from_proto,
    metadata_to_proto,
    replication_spec_from_proto,
    reports_from_proto,
    topic_config_from_proto,
    topic_to_proto,
)
from sluice.coordinator.heartbeat_stream import HeartbeatStream
from sluice.coordinator.limits import mutation_key
from sluice.coordinator.producer_ids import ProducerIdentity
from sluice.coordinator.service import CoordinatorService
from sluice.coordinator.visibility import (
    authorize_idempotent_write,
    may_describe_group,
    may_describe_topic,
    visible_metadata,
)
from sluice.security.audit import audit_current
from sluice.server.runtime import Registrar
from sluice.v1 import coordinator_pb2 as pb
from sluice.v1 import coordinator_pb2_grpc

Context = aio.ServicerContext[Any, Any]

SERVICE_NAME = "sluice.v1.Coordinator"


class CoordinatorServicer(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, service: CoordinatorService) -> None:
        self._service = service

    # ---- cluster membership --------------------------------------------------------------------------

    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: Context
    ) -> pb.RegisterBrokerResponse:
        endpoint = endpoint_from_proto(
            request.endpoint, request.HasField("endpoint"), f"broker {request.broker_id}"
        )
        reg = await self._service.register_broker(
            request.broker_id,
            endpoint,
            request.incarnation,
            request.rack,
            request.controller_epoch,
            log_reports_from_proto(request.logs),
            request.unclean_shutdown,
        )
        return pb.RegisterBrokerResponse(
            broker_epoch=reg.epoch,
            heartbeat_interval_ms=reg.heartbeat_interval_ms,
            session_timeout_ms=reg.session_timeout_ms,
        )

    async def BrokerHeartbeat(
        self, request: pb.BrokerHeartbeatRequest, context: Context
    ) -> pb.BrokerHeartbeatResponse:
        result = await self._service.broker_heartbeat(
            request.broker_id,
            request.broker_epoch,
            request.metadata_version,
            request.controller_epoch,
            reports_from_proto(request.broker_id, request.epochs_ahead),
        )
        if request.damaged and result.error is None:
            await self._service.replicas_unfit(
                request.broker_id, log_reports_from_proto(request.damaged), unclean=False
            )
        response = pb.BrokerHeartbeatResponse()
        if result.error is not None:
            response.error.CopyFrom(result.error.to_proto())
        if result.update is not None:
            response.update.CopyFrom(broker_update_to_proto(result.update, self._service.epoch))
        return response

    async def RegisterDispatcher(
        self, request: pb.RegisterDispatcherRequest, context: Context
    ) -> pb.RegisterDispatcherResponse:
        endpoint = endpoint_from_proto(
            request.endpoint, request.HasField("endpoint"), f"dispatcher {request.dispatcher_id}"
        )
        reg = await self._service.register_dispatcher(request.dispatcher_id, endpoint, request.incarnation)
        return pb.RegisterDispatcherResponse(
            dispatcher_epoch=reg.epoch, heartbeat_interval_ms=reg.heartbeat_interval_ms
        )

    # ---- topics and routing --------------------------------------------------------------------------

    async def CreateTopic(self, request: pb.CreateTopicRequest, context: Context) -> pb.CreateTopicResponse:
        topic, unacked = await self._service.create_topic(
            request.name,
            request.partitions,
            topic_config_from_proto(request.config),
            replication_spec_from_proto(request),
            who=mutation_key(),
        )
        return pb.CreateTopicResponse(
            topic=topic_to_proto(topic), unacknowledged=[e.to_proto() for e in unacked]
        )

    async def AddPartitions(
        self, request: pb.AddPartitionsRequest, context: Context
    ) -> pb.AddPartitionsResponse:
        topic, unacked = await self._service.add_partitions(
            request.name, request.partitions, who=mutation_key()
        )
        return pb.AddPartitionsResponse(
            topic=topic_to_proto(topic), unacknowledged=[e.to_proto() for e in unacked]
        )

    async def AlterTopic(self, request: pb.AlterTopicRequest, context: Context) -> pb.AlterTopicResponse:
        unclean = request.unclean_leader_election if request.HasField("unclean_leader_election") else None
        topic, unacked = await self._service.alter_topic(
            request.name,
            request.min_insync_replicas,
            unclean,
            request.replication_factor,
            request.throttle_bytes_per_second,
        )
        return pb.AlterTopicResponse(
            topic=topic_to_proto(topic), unacknowledged=[e.to_proto() for e in unacked]
        )

    async def DeleteTopic(self, request: pb.DeleteTopicRequest, context: Context) -> pb.DeleteTopicResponse:
        unacked = await self._service.delete_topic(request.name, who=mutation_key())
        audit_current("topic.delete", {"topic": request.name})
        return pb.DeleteTopicResponse(unacknowledged=[e.to_proto() for e in unacked])

    async def ListTopics(self, request: pb.ListTopicsRequest, context: Context) -> pb.ListTopicsResponse:
        topics = [topic_to_proto(t) for t in self._service.list_topics() if may_describe_topic(t.name)]
        return pb.ListTopicsResponse(topics=topics)

    async def DescribeTopic(
        self, request: pb.DescribeTopicRequest, context: Context
    ) -> pb.DescribeTopicResponse:
        return pb.DescribeTopicResponse(topic=topic_to_proto(self._service.describe_topic(request.name)))

    async def Metadata(self, request: pb.MetadataRequest, context: Context) -> pb.MetadataResponse:
        election = self._service.election
        if election is not None and not election.is_leader():
            # A standby relays the leader's answer (its ``coordinator`` is the leader): docs/election.md.
            return await election.forward_metadata(request, context.invocation_metadata())
        view = self._service.metadata(list(request.topics))
        response = metadata_to_proto(view, self._service.coordinator_endpoint, self._service.offset_store)
        return visible_metadata(response, list(request.topics))

    # ---- idempotent producers ----------------------------------------------------------------------

    async def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: Context
    ) -> pb.InitProducerIdResponse:
        authorize_idempotent_write()
        given = request.producer_id >= 0 or request.producer_epoch >= 0
        current = ProducerIdentity(request.producer_id, request.producer_epoch) if given else None
        identity = await self._service.init_producer_id(request.client_id, current)
        return pb.InitProducerIdResponse(
            producer_id=identity.producer_id, producer_epoch=identity.producer_epoch
        )

    # ---- replication -------------------------------------------------------------------------------

    async def AlterPartition(
        self, request: pb.AlterPartitionRequest, context: Context
    ) -> pb.AlterPartitionResponse:
        state = await self._service.alter_partition(
            IsrProposal(
                request.topic,
                request.partition,
                request.leader_id,
                request.leader_epoch,
                request.partition_epoch,
                tuple(request.new_isr),
            )
        )
        return pb.AlterPartitionResponse(
            leader=state.leader,
            leader_epoch=state.leader_epoch,
            partition_epoch=state.partition_epoch,
            isr=list(state.isr),
            elr=list(state.elr),
        )

    async def ControlledShutdown(
        self, request: pb.ControlledShutdownRequest, context: Context
    ) -> pb.ControlledShutdownResponse:
        result = await self._service.controlled_shutdown(request.broker_id, request.broker_epoch)
        leader = request.broker_id
        return pb.ControlledShutdownResponse(
            remaining=[pb.LedPartition(topic=t, partition=p, leader=leader) for t, p in result.remaining],
            may_move=result.may_move,
        )

    async def ElectLeaders(
        self, request: pb.ElectLeadersRequest, context: Context
    ) -> pb.ElectLeadersResponse:
        elected = await self._service.elect_leaders(tuple(request.topics))
        return pb.ElectLeadersResponse(
            elected=[pb.LedPartition(topic=t, partition=p, leader=b) for t, p, b in elected]
        )

    async def ReassignPartitions(
        self, request: pb.ReassignPartitionsRequest, context: Context
    ) -> pb.ReassignPartitionsResponse:
        wanted = [Reassignment(r.topic, r.partition, tuple(r.replicas)) for r in request.reassignments]
        if request.cancel:
            await self._service.cancel_reassignments([(r.topic, r.partition) for r in wanted])
        else:
            await self._service.reassign_partitions(wanted, request.throttle_bytes_per_second)
        topics = sorted({r.topic for r in wanted})
        return pb.ReassignPartitionsResponse(
            topics=[topic_to_proto(self._service.describe_topic(t)) for t in topics]
        )

    async def RecoverPartition(
        self, request: pb.RecoverPartitionRequest, context: Context
    ) -> pb.RecoverPartitionResponse:
        plan = await self._service.recover_partition(
            request.topic, request.partition, dry_run=request.dry_run
        )
        return pb.RecoverPartitionResponse(
            leader=plan.leader,
            leader_epoch=plan.leader_epoch,
            candidates=[
                pb.RecoveryCandidate(
                    broker_id=c.broker,
                    last_leader_epoch=c.last_leader_epoch,
                    log_end_offset=c.log_end_offset,
                    damaged=c.damaged,
                )
                for c in plan.candidates
            ],
            missing=list(plan.missing),
            recovered=not request.dry_run,
        )

    # ---- consumer groups ---------------------------------------------------------------------------

    async def Heartbeat(
        self, request: pb.GroupHeartbeatRequest, context: Context
    ) -> pb.GroupHeartbeatResponse:
        return heartbeat_to_proto(await self._service.heartbeat(heartbeat_from_proto(request)))

    async def ConsumerGroupStream(
        self, request_iterator: AsyncIterator[pb.GroupStreamRequest], context: Context
    ) -> AsyncIterator[pb.GroupStreamResponse]:
        async for response in HeartbeatStream(self._service).run(request_iterator):
            yield response

    async def LeaveGroup(self, request: pb.LeaveGroupRequest, context: Context) -> pb.LeaveGroupResponse:
        await self._service.leave_group(request.group, request.member_id, request.member_epoch)
        return pb.LeaveGroupResponse()

    async def ListGroups(self, request: pb.ListGroupsRequest, context: Context) -> pb.ListGroupsResponse:
        groups = [
            group_summary_to_proto(g) for g in self._service.list_groups() if may_describe_group(g.group)
        ]
        return pb.ListGroupsResponse(groups=groups)

    async def DescribeGroup(
        self, request: pb.DescribeGroupRequest, context: Context
    ) -> pb.DescribeGroupResponse:
        description, rows, times = await self._service.describe_group(request.group)
        return describe_group_to_proto(request.group, description, rows, times)

    async def DeleteGroup(self, request: pb.DeleteGroupRequest, context: Context) -> pb.DeleteGroupResponse:
        deleted = await self._service.delete_group(request.group)
        audit_current("group.delete", {"group": request.group, "offsets_deleted": deleted})
        return pb.DeleteGroupResponse(offsets_deleted=deleted)

    async def SetGroupConfig(
        self, request: pb.SetGroupConfigRequest, context: Context
    ) -> pb.SetGroupConfigResponse:
        config, policy_given = group_config_from_proto(request.config)
        merged = await self._service.set_group_config(request.group, config, policy_given)
        return pb.SetGroupConfigResponse(config=group_config_to_proto(merged))


def registrar(service: CoordinatorService) -> Registrar:
    """A ``GrpcServer`` registrar that adds the Coordinator servicer."""

    def register(server: aio.Server) -> None:
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(CoordinatorServicer(service), server)

    return register
