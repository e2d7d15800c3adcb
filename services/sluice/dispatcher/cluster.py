"""The dispatcher's view of the cluster: registration with the coordinator and cached metadata.

``CoordinatorLink.run`` registers (``RegisterDispatcher``; until it works, after the peer backoff),
then re-registers every ``heartbeat_interval_ms`` (there is no dispatcher heartbeat RPC; re-registering
with the same incarnation renews the session) and re-reads ``Metadata`` every refresh interval. Its
channels are the peer layer's (``sluice.common.peers``), and ``list_offsets`` is the peer layer's
planner routed by this view, refreshing it after routing errors once per burst. The registration
epoch is the cursor ``owner_epoch``: a newer registration of any dispatcher has a higher epoch, so a
stale dispatcher cannot overwrite a cursor the new owner has written.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from sluice.common import list_offsets as planner
from sluice.common.backoff import Backoff
from sluice.common.peers import AioPeers, AioRefreshGate
from sluice.common.rpc import error_from_rpc
from sluice.errors import (
    BrokerNotAvailable,
    NotDispatcher,
    SluiceError,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from sluice.v1 import coordinator_pb2, coordinator_pb2_grpc

log = logging.getLogger(__name__)

__all__ = ["ClusterView", "CoordinatorLink", "Route"]

RPC_TIMEOUT = 10.0
#: How long ListOffsets keeps retrying routing errors (a broker restarting, a partition moving).
LIST_OFFSETS_RETRY_S = 10.0


def _address(ep: coordinator_pb2.Endpoint) -> str:
    return f"{ep.host}:{ep.port}" if ep.host and ep.port else ""


@dataclass(frozen=True)
class Route:
    """Where one partition lives: its broker and its dispatcher."""

    broker: str
    dispatcher_id: str
    dispatcher: str


@dataclass
class ClusterView:
    """A snapshot of ``Metadata``; replaced (never edited) on refresh."""

    topics: dict[str, coordinator_pb2.TopicDescription] = field(default_factory=dict)
    brokers: dict[int, str] = field(default_factory=dict)
    #: A broker's gRPC address -> its wire-protocol address, for brokers that serve one.
    broker_wire: dict[str, str] = field(default_factory=dict)
    dispatchers: dict[str, str] = field(default_factory=dict)
    offset_store: str = ""
    version: int = 0

    @classmethod
    def from_proto(cls, md: coordinator_pb2.MetadataResponse) -> ClusterView:
        return cls(
            topics={t.name: t for t in md.topics},
            brokers={b.broker_id: _address(b.endpoint) for b in md.brokers},
            broker_wire={
                _address(b.endpoint): f"{b.endpoint.host}:{b.endpoint.wire_port}"
                for b in md.brokers
                if b.endpoint.host and b.endpoint.wire_port
            },
            dispatchers={d.dispatcher_id: _address(d.endpoint) for d in md.dispatchers},
            offset_store=_address(md.offset_store),
            version=md.metadata_version,
        )

    def route(self, topic: str, partition: int) -> Route | None:
        t = self.topics.get(topic)
        if t is None or not 0 <= partition < len(t.partitions):
            return None
        p = t.partitions[partition]
        return Route(
            self.brokers.get(p.broker_id, ""), p.dispatcher_id, self.dispatchers.get(p.dispatcher_id, "")
        )

    def leader_epoch(self, topic: str, partition: int) -> int | None:
        """The partition's leader epoch, which fetches carry (KIP-320); None when unknown."""
        t = self.topics.get(topic)
        if t is None or not 0 <= partition < len(t.partitions):
            return None
        return t.partitions[partition].leader_epoch

    def partitions_of(self, topic: str, dispatcher_id: str) -> list[int]:
        t = self.topics.get(topic)
        return [] if t is None else [p.partition for p in t.partitions if p.dispatcher_id == dispatcher_id]

    def not_dispatcher(self, topic: str, partitions: list[int]) -> NotDispatcher:
        """The NOT_DISPATCHER error naming where each partition is served instead."""
        parts = []
        for p in partitions:
            r = self.route(topic, p)
            if r is None or not r.dispatcher_id:
                parts.append(f"{topic}/{p} -> no live dispatcher")
            else:
                parts.append(f"{topic}/{p} -> dispatcher {r.dispatcher_id} at {r.dispatcher or '?'}")
        return NotDispatcher("partitions are served by another dispatcher: " + "; ".join(parts))


class CoordinatorLink:
    """Registration, heartbeat-by-re-registration and metadata refresh."""

    def __init__(
        self,
        address: str,
        dispatcher_id: str,
        channels: AioPeers,
        refresh_interval_s: float,
        on_view: Callable[[ClusterView], None],
    ) -> None:
        self.address = address
        self.dispatcher_id = dispatcher_id
        self.incarnation = uuid.uuid4().hex
        self._channels = channels
        self._refresh_interval = refresh_interval_s
        self._on_view = on_view
        self.epoch = 0
        self.heartbeat_s = 2.0
        self.registered = asyncio.Event()
        self.view = ClusterView()
        self._refreshing: asyncio.Future[ClusterView] | None = None
        #: Routing errors (ListOffsets, a feed's failed fetch) refresh the view through here: once per burst.
        self.routing = AioRefreshGate(self.refresh)
        self.endpoint: tuple[str, int] = ("", 0)
        #: The wire-protocol port this dispatcher serves consumers on (0: none).
        self.wire_port = 0

    @property
    def stub(self) -> coordinator_pb2_grpc.CoordinatorAsyncStub:
        return self._channels.coordinator(self.address)

    async def register(self) -> None:
        host, port = self.endpoint
        resp = await self.stub.RegisterDispatcher(
            coordinator_pb2.RegisterDispatcherRequest(
                dispatcher_id=self.dispatcher_id,
                endpoint=coordinator_pb2.Endpoint(host=host, port=port, wire_port=self.wire_port),
                incarnation=self.incarnation,
            ),
            timeout=RPC_TIMEOUT,
        )
        if resp.dispatcher_epoch != self.epoch:
            log.info("dispatcher %s registered with epoch %d", self.dispatcher_id, resp.dispatcher_epoch)
        self.epoch = resp.dispatcher_epoch
        if resp.heartbeat_interval_ms > 0:
            self.heartbeat_s = resp.heartbeat_interval_ms / 1000
        self.registered.set()

    async def run(self, host: str, port: int, wire_port: int = 0) -> None:
        """Register until it works, then keep the session and the metadata fresh. Runs until cancelled."""
        self.endpoint = (host, port)
        self.wire_port = wire_port
        backoff = Backoff()
        while True:
            try:
                await self.register()
                await self.refresh()
                break
            except (grpc.RpcError, SluiceError) as exc:
                log.warning("cannot register with the coordinator at %s yet: %s", self.address, exc)
                await asyncio.sleep(backoff.next())
        loop = asyncio.get_running_loop()
        next_register = loop.time() + self.heartbeat_s
        while True:
            await asyncio.sleep(min(self.heartbeat_s, self._refresh_interval))
            try:
                if loop.time() >= next_register:
                    await self.register()
                    next_register = loop.time() + self.heartbeat_s
                await self.refresh()
            except (grpc.RpcError, SluiceError) as exc:
                log.warning("coordinator %s: %s", self.address, exc)

    async def refresh(self) -> ClusterView:
        """Read ``Metadata`` now; concurrent callers share one request."""
        if self._refreshing is not None:
            return await asyncio.shield(self._refreshing)
        fut: asyncio.Future[ClusterView] = asyncio.get_running_loop().create_future()
        self._refreshing = fut
        try:
            try:
                md = await self.stub.Metadata(coordinator_pb2.MetadataRequest(), timeout=RPC_TIMEOUT)
            except grpc.RpcError as exc:
                raise error_from_rpc(exc) from None
            view = ClusterView.from_proto(md)
            self.view = view
            self._on_view(view)
            fut.set_result(view)
            return view
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        finally:
            self._refreshing = None

    async def topic(self, name: str, fresh: bool = False) -> coordinator_pb2.TopicDescription:
        """The topic's description, refreshing metadata once if it is not known yet, or first of all
        when ``fresh`` (a new subscriber must get the topic as it is now: the cached view may still
        hold a deleted incarnation of the name, and binding to it would end the subscription at once)."""
        t = None if fresh else self.view.topics.get(name)
        if t is None:
            t = (await self.refresh()).topics.get(name)
        if t is None:
            raise UnknownTopicOrPartition(f"topic {name!r} does not exist (create it first)")
        return t

    async def ensure_topic(self, name: str, partitions: int = 1) -> coordinator_pb2.TopicDescription:
        """Create the topic if missing (the DLQ topic); an existing one is fine."""
        try:
            return await self.topic(name)
        except UnknownTopicOrPartition:
            pass
        try:
            await self.stub.CreateTopic(
                coordinator_pb2.CreateTopicRequest(name=name, partitions=partitions), timeout=RPC_TIMEOUT
            )
        except grpc.RpcError as exc:
            err = error_from_rpc(exc)
            if not isinstance(err, TopicAlreadyExists):
                raise err from None
        return await self.topic(name)

    def wire_for(self, broker: str) -> str | None:
        """The wire-protocol address of the broker at gRPC address ``broker``, if it serves one."""
        return self.view.broker_wire.get(broker)

    def broker_for(self, topic: str, partition: int) -> str:
        route = self.view.route(topic, partition)
        if route is None or not route.broker:
            raise BrokerNotAvailable(f"no broker address known for {topic}/{partition}")
        return route.broker

    async def list_offsets(self, topic: str, partitions: list[int], timestamp: int) -> dict[int, int]:
        """``{partition: offset}`` at ``timestamp`` (``planner.EARLIEST`` / ``LATEST`` / ms); raises the
        typed error of a partition left without one (routing errors after ``LIST_OFFSETS_RETRY_S``)."""
        answer = await planner.list_offsets(
            self._channels,
            [(topic, p) for p in partitions],
            timestamp,
            self._leader_of,
            bound=planner.RetryBound(LIST_OFFSETS_RETRY_S),
            rpc_timeout=RPC_TIMEOUT,
            gate=self.routing,
        )
        error = answer.first_error()
        if error is not None:
            raise error
        return {p: answer.offsets[(topic, p)] for p in partitions}

    def _leader_of(self, topic: str, partition: int) -> str | None:
        route = self.view.route(topic, partition)
        return route.broker if route is not None and route.broker else None
