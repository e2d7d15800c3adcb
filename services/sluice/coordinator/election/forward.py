"""A standby answers ``Metadata`` by forwarding it to the leader.

Clients bootstrap from any replica (in Kubernetes the coordinator Service picks one), so ``Metadata`` must
give a correct answer everywhere: a standby has no current state of its own (liveness and the latest
topics live in the leader), so it asks the leader and relays the answer, whose ``coordinator`` field is
the leader's address. Every other RPC is refused with ``NOT_COORDINATOR`` (guard.py) and the SDK goes to
that address.

At most one hop: a forwarded request carries the header ``sluice-forwarded-by``, and a replica that is
not the leader either refuses it rather than forwarding again (two standbys with stale views cannot
bounce a request between them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from grpc import aio

from sluice.common.peers import AioPeers
from sluice.common.rpc import answered_error, error_from_rpc
from sluice.coordinator.election.base import Elector
from sluice.coordinator.election.guard import not_leader
from sluice.errors import NotCoordinator
from sluice.v1 import coordinator_pb2 as pb

__all__ = ["FORWARDED_HEADER", "MetadataForwarder"]

log = logging.getLogger(__name__)

FORWARDED_HEADER = "sluice-forwarded-by"
FORWARD_TIMEOUT_S = 5.0


class MetadataForwarder:
    """Caller: the coordinator servicer's ``Metadata`` when this replica is not the leader."""

    def __init__(self, elector: Elector, timeout_s: float = FORWARD_TIMEOUT_S) -> None:
        self._elector = elector
        self._timeout_s = timeout_s
        # One channel: to the leader. A new leader's evicts the old one's, which is of no further use.
        self._peers = AioPeers(max_peers=1)

    async def metadata(
        self, request: pb.MetadataRequest, invocation_metadata: Iterable[Any] | None = None
    ) -> pb.MetadataResponse:
        for item in invocation_metadata or ():
            key = item[0] if isinstance(item, tuple) else getattr(item, "key", "")
            if key == FORWARDED_HEADER:
                raise not_leader(self._elector, " (a forwarded request is not forwarded again)")
        leader = self._elector.leader()
        if leader is None or leader.identity == self._elector.identity:
            raise not_leader(self._elector)
        stub = self._peers.coordinator(leader.address)
        try:
            response: pb.MetadataResponse = await stub.Metadata(
                request,
                timeout=self._timeout_s,
                metadata=((FORWARDED_HEADER, self._elector.identity),),
            )
        except aio.AioRpcError as exc:
            error = answered_error(exc)
            if error is None or isinstance(error, NotCoordinator):
                # The leader we know of is gone or no longer leads: the election will tell.
                why = (error or error_from_rpc(exc)).message
                raise not_leader(self._elector, f" (the leader did not answer: {why})") from None
            raise error from None  # the leader's own answer (e.g. INVALID_TOPIC): relay it as is
        return response

    async def close(self) -> None:
        await self._peers.close()
