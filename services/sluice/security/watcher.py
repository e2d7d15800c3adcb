"""Keeps a service's copy of the ACLs (and user generations) current: a long poll of the coordinator.

Every broker, dispatcher and offset store runs one :class:`SecurityWatcher` as a task. It calls
``Acls.WatchSecurity(known_version, max_wait_ms)`` in a loop: the coordinator answers at once with the full
snapshot when its security version differs from ours, else holds the call until something changes (or
``max_wait_ms`` passes). On each snapshot the watcher replaces the authorizer's ``AclSet`` (which drops its
cached decisions and runs its ``on_change`` listeners) after updating :attr:`user_generations`, so a listener
sees both. A check therefore never waits on the network: it reads what the last snapshot left.

Finding the coordinator: the configured address (a Kubernetes Service, ``sluice up``'s port), as the
broker's ``CoordinatorLink`` does. A standby answers NOT_COORDINATOR naming the leader (docs/election.md):
the watcher asks the named leader next, at once, and goes back to the configured address after any other
failure. Failures back off with the peer layer's ``Backoff``; meanwhile the service keeps deciding with the
last snapshot it had (never with nothing: before the first snapshot the set is empty, so with authorization
on everything but super users and the cluster is refused: fail closed).
"""

from __future__ import annotations

import asyncio
import logging
import re

import grpc
from prometheus_client import Gauge

from sluice.common.backoff import Backoff
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc
from sluice.errors import NotCoordinator, SluiceError
from sluice.security.acl import AclAuthorizer, AclEntry, AclSet
from sluice.security.acl_proto import entry_from_proto
from sluice.v1 import acl_pb2

__all__ = ["DEFAULT_MAX_WAIT_MS", "SecurityWatcher"]

log = logging.getLogger(__name__)

#: The security snapshot this process decides from (a version of the coordinator's ACLs and users):
#: compare across services to see that an ACL change is in force everywhere.
SECURITY_VERSION = Gauge("sluice_security_version", "The security snapshot version this process holds")

#: How long one poll waits for a change on the coordinator (its own cap is 60 s).
DEFAULT_MAX_WAIT_MS = 30_000
#: Added to max_wait for the RPC deadline: the answer takes a moment to come back.
RPC_SLACK_S = 5.0
#: The leader a standby names in NOT_COORDINATOR (the message format is a contract: docs/election.md;
#: coordinator/election/guard.py writes it. Parsed here so a broker never imports the coordinator).
_LEADER_IS = re.compile(r"leader is (\S+:\d+)")


class SecurityWatcher:
    """One service's subscription to the coordinator's security snapshots. Use from one event loop."""

    def __init__(
        self,
        coordinator_address: str,
        authorizer: AclAuthorizer,
        peers: AioPeers | None = None,
        *,
        max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
    ) -> None:
        self.coordinator_address = coordinator_address
        self.authorizer = authorizer
        self.max_wait_ms = max_wait_ms
        self._peers = peers
        #: The security version held (0: none yet).
        self.version = authorizer.version
        #: User name -> credential generation, from the last snapshot.
        self.user_generations: dict[str, int] = {}
        #: Set once the coordinator has answered (with a snapshot, or "you are current").
        self.synced = asyncio.Event()
        #: Where the next poll goes: the configured address, or the leader a standby named.
        self.target = coordinator_address
        self._task: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="security-watcher")
        return self._task

    async def stop(self) -> None:
        """Cancel the poll and wait for it; idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def run(self) -> None:
        """Poll until cancelled."""
        backoff = Backoff()
        peers = self._peers if self._peers is not None else AioPeers(max_peers=4)
        redirected = False
        try:
            while True:
                try:
                    await self.poll_once(peers)
                    backoff.reset()
                    redirected = False
                    continue
                except grpc.RpcError as exc:
                    error: SluiceError = error_from_rpc(exc)
                except SluiceError as exc:  # a snapshot that does not decode
                    error = exc
                leader = _LEADER_IS.search(error.message) if isinstance(error, NotCoordinator) else None
                if leader is not None and not redirected and leader.group(1) != self.target:
                    redirected = True  # one hop at once; a second one in a row backs off (no ping-pong)
                    self.target = leader.group(1)
                    log.info("security snapshots: following the coordinator leader at %s", self.target)
                    continue
                self.target = leader.group(1) if leader is not None else self.coordinator_address
                redirected = False
                delay = backoff.next()
                log.warning("security snapshots from %s: %s; retrying in %.1fs", self.target, error, delay)
                await asyncio.sleep(delay)
        finally:
            if self._peers is None:
                await peers.close()

    async def poll_once(self, peers: AioPeers) -> bool:
        """One WatchSecurity call; applies a snapshot if one came. Returns whether one did."""
        # Until the first answer, ask for one at once: a coordinator at version 0 (no ACLs, no users) is
        # what an empty copy already holds, and would otherwise keep "synced" waiting a whole poll.
        wait_ms = self.max_wait_ms if self.synced.is_set() else 0
        response: acl_pb2.WatchSecurityResponse = await peers.acls(self.target).WatchSecurity(
            acl_pb2.WatchSecurityRequest(known_version=self.version, max_wait_ms=wait_ms),
            timeout=wait_ms / 1000 + RPC_SLACK_S,
        )
        self.synced.set()
        if not response.changed:
            return False
        self.apply(response.snapshot)
        return True

    def apply(self, snapshot: acl_pb2.SecuritySnapshot) -> None:
        """Hold ``snapshot`` from now on: user generations first, then the ACLs (listeners run then)."""
        entries: list[AclEntry] = []
        for msg in snapshot.acls:
            try:
                entries.append(entry_from_proto(msg))
            except SluiceError as exc:
                # An entry this service cannot read (a newer coordinator's operation or resource type)
                # is about something this service never checks; dropping it grants nothing.
                log.warning("ignoring an ACL entry this service does not know: %s", exc)
        self.user_generations = dict(snapshot.user_generations)
        self.version = snapshot.version
        self.authorizer.replace(AclSet(entries, snapshot.version))
        SECURITY_VERSION.set(snapshot.version)
        log.info("security version %d: %d ACL entries", snapshot.version, len(entries))
