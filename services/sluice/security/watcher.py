"""Keeps a service's copy of the ACLs (and user generations) current: a long poll of the coordinator.

Every broker, dispatcher and offset store runs one :class:`SecurityWatcher` as a task. It calls
``Acls.WatchSecurity(known_version, max_wait_ms)`` in a loop: the coordinator answers at once with the full
snapshot when its security version differs from ours, else holds the call until something changes (or
``max_wait_ms`` passes). On each snapshot the watcher replaces the authorizer's ``AclSet`` (which drops its
cached decisions and runs its ``on_change`` listeners) after updating :attr:`user_generations`, so a listener
sees both. A check therefore never waits on the network: it reads what the last snapshot left.

The loop, finding the coordinator (a standby names the leader) and backing off are
``sluice.common.long_poll``'s. Meanwhile the service keeps deciding with the last snapshot it had (never
with nothing: before the first snapshot the set is empty, so with authorization on everything but super
users and the cluster is refused: fail closed).
"""

from __future__ import annotations

import logging

from prometheus_client import Gauge

from sluice.common.long_poll import DEFAULT_MAX_WAIT_MS, RPC_SLACK_S, CoordinatorLongPoll
from sluice.common.peers import AioPeers
from sluice.errors import SluiceError
from sluice.security.acl import AclAuthorizer, AclEntry, AclSet
from sluice.security.acl_proto import entry_from_proto
from sluice.v1 import acl_pb2

__all__ = ["DEFAULT_MAX_WAIT_MS", "SecurityWatcher"]

log = logging.getLogger(__name__)

#: The security snapshot this process decides from (a version of the coordinator's ACLs and users):
#: compare across services to see that an ACL change is in force everywhere.
SECURITY_VERSION = Gauge("sluice_security_version", "The security snapshot version this process holds")


class SecurityWatcher(CoordinatorLongPoll):
    """One service's subscription to the coordinator's security snapshots. Use from one event loop."""

    what = "security snapshots"

    def __init__(
        self,
        coordinator_address: str,
        authorizer: AclAuthorizer,
        peers: AioPeers | None = None,
        *,
        max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
    ) -> None:
        super().__init__(coordinator_address, peers, max_wait_ms=max_wait_ms)
        self.authorizer = authorizer
        #: The security version held (0: none yet).
        self.version = authorizer.version
        #: User name -> credential generation, from the last snapshot.
        self.user_generations: dict[str, int] = {}

    async def poll_once(self, peers: AioPeers) -> bool:
        """One WatchSecurity call; applies a snapshot if one came. Returns whether one did."""
        wait_ms = self.wait_ms
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
