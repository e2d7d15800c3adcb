"""Broker membership: register with the coordinator, then heartbeat for as long as we run.

- ``RegisterBroker`` with a random incarnation (new on every process start, so a stale process
  cannot heartbeat in the name of a newer one) returns the broker epoch and the heartbeat
  interval.
- ``BrokerHeartbeat`` every interval reports the metadata version the broker last applied;
  a response carrying ``update`` goes through the same code path as the UpdatePartitions RPC.
- A heartbeat answered with an error (unknown broker, stale epoch) makes the broker register
  again. An unreachable coordinator is retried with the peer layer's backoff
  (``sluice.common.backoff``: 100 ms doubling to 2 s, jittered); the broker keeps serving what it has
  meanwhile. The channel is the peer layer's too; errors decode through ``error_from_rpc`` /
  ``error_from_proto``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable

import grpc

from sluice.broker.assignment import AssignmentUpdate
from sluice.broker.servicer import update_from_proto
from sluice.common.backoff import Backoff
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc
from sluice.common.timeouts import within
from sluice.errors import SluiceError, error_from_proto
from sluice.v1 import coordinator_pb2, coordinator_pb2_grpc

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_S = 3.0
RPC_TIMEOUT_S = 5.0


class CoordinatorLink:
    """Keeps this broker registered. Caller: ``sluice.broker.main`` (one task per process)."""

    def __init__(
        self,
        address: str,
        *,
        broker_id: int,
        host: str,
        port: int,
        apply_update: Callable[[AssignmentUpdate], Awaitable[None]],
        rack: str = "",
        metadata_version: Callable[[], int],
        controller_epoch: Callable[[], int] = lambda: 0,
        epoch_reports: Callable[[], list[coordinator_pb2.PartitionEpochReport]] = list,
        log_reports: Callable[[], list[coordinator_pb2.PartitionLogReport]] = list,
        unclean: bool = False,
        damaged: Callable[[], list[coordinator_pb2.PartitionLogReport]] = list,
    ) -> None:
        self.address = address
        self.broker_id = broker_id
        self.host = host
        self.port = port
        self.rack = rack
        #: The wire-protocol port to advertise (0: none); set once bound, like ``port``.
        self.wire_port = 0
        self.incarnation = uuid.uuid4().hex
        self._apply = apply_update
        self._version = metadata_version
        #: The highest controller epoch obeyed, reported so a coordinator behind it catches up.
        self._controller_epoch = controller_epoch
        #: Partitions the controller is behind on (epoch_reports.py), sent with every heartbeat.
        self._epoch_reports = epoch_reports
        #: Every log this broker holds, listed at each registration: the controller removes the strays
        #: (replicas moved away while this broker was down: coordinator/cluster/strays.py).
        self._log_reports = log_reports
        #: This process started after an unclean shutdown: said until a registration is answered (then
        #: the controller has taken it out of every ISR and ELR; KIP-966).
        self._unclean = unclean
        #: Partitions found damaged while serving: reported with the next heartbeat, which goes at once.
        self._damaged = damaged
        self.damage_found = asyncio.Event()
        self.broker_epoch = -1
        #: Set once registered (tests and readiness can wait on it).
        self.registered = asyncio.Event()

    async def run(self) -> None:
        """Register, heartbeat, register again when refused or unreachable. Runs until cancelled."""
        backoff = Backoff()
        peers = AioPeers(max_peers=1)
        try:
            while True:
                stub = peers.coordinator(self.address)
                try:
                    interval = await self._register(stub)
                    backoff.reset()
                    await self._heartbeat_until_error(stub, interval)
                    # Refused: register again after one interval, not in a tight loop.
                    await asyncio.sleep(interval)
                    continue
                except grpc.RpcError as exc:
                    delay = backoff.next()
                    log.warning(
                        "coordinator %s: %s; retrying in %.1fs", self.address, error_from_rpc(exc), delay
                    )
                except Exception:
                    delay = backoff.next()
                    log.exception("coordinator link failed; retrying in %.1fs", delay)
                self.registered.clear()
                await asyncio.sleep(delay)
        finally:
            await peers.close()

    async def _register(self, stub: coordinator_pb2_grpc.CoordinatorAsyncStub) -> float:
        request = coordinator_pb2.RegisterBrokerRequest(
            broker_id=self.broker_id,
            endpoint=coordinator_pb2.Endpoint(host=self.host, port=self.port, wire_port=self.wire_port),
            incarnation=self.incarnation,
            rack=self.rack,
            controller_epoch=self._controller_epoch(),
        )
        logs = self._log_reports()
        request.logs.extend(logs)
        unclean = request.unclean_shutdown = self._unclean
        # An unclean answer waits for the controller's removal (one write over every topic the broker holds).
        resp = await stub.RegisterBroker(request, timeout=RPC_TIMEOUT_S * (3 if unclean else 1))
        self._unclean = False
        if unclean and logs:  # none: a new or emptied data directory (the controller knows what it held)
            log.warning(
                "registered after an unclean shutdown (%d partition logs reported, %d damaged): out of every "
                "in-sync replica set until caught up",
                len(logs),
                sum(1 for r in logs if r.damaged),
            )
        self.broker_epoch = resp.broker_epoch
        self.registered.set()
        interval = (
            resp.heartbeat_interval_ms / 1000 if resp.heartbeat_interval_ms > 0 else DEFAULT_HEARTBEAT_S
        )
        log.info(
            "registered with coordinator %s as broker %d epoch %d",
            self.address,
            self.broker_id,
            self.broker_epoch,
        )
        return interval

    async def _heartbeat_until_error(
        self, stub: coordinator_pb2_grpc.CoordinatorAsyncStub, interval: float
    ) -> None:
        answered_now = False
        while True:
            self.damage_found.clear()
            resp = await stub.BrokerHeartbeat(
                coordinator_pb2.BrokerHeartbeatRequest(
                    broker_id=self.broker_id,
                    broker_epoch=self.broker_epoch,
                    metadata_version=self._version(),
                    controller_epoch=self._controller_epoch(),
                    epochs_ahead=self._epoch_reports(),
                    damaged=self._damaged(),
                ),
                timeout=max(RPC_TIMEOUT_S, 2 * interval),
            )
            refused = error_from_proto(resp.error)
            if refused is not None:
                log.warning("heartbeat refused (%s: %s): registering again", type(refused).__name__, refused)
                self.registered.clear()
                return
            answer_now = False
            if resp.HasField("update"):
                try:
                    await self._apply(update_from_proto(resp.update))
                    # A full assignment (a new controller term, or versions apart): the next heartbeat
                    # goes at once, so the controller learns what this broker is ahead on before it
                    # elects anyone (docs/replication.md, "Controller state that cannot roll back").
                    # Once per full update, which the coordinator sends only then: bounded.
                    answer_now = resp.update.full and not answered_now
                except SluiceError as err:
                    log.error("could not apply the partition update from the coordinator: %s", err)
            # The heartbeat timer: the coordinator's session timeout is counted in these. Never two
            # immediate heartbeats in a row.
            answered_now = answer_now
            if answer_now:
                await asyncio.sleep(0)
                continue
            # Damage found while serving is news for the controller now, not one interval later.
            with contextlib.suppress(TimeoutError):
                await within(self.damage_found.wait(), interval)
