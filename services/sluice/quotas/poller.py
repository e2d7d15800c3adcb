"""Keeps a broker's or dispatcher's quotas current: a long poll of the coordinator (WatchQuotas).

The loop is ``sluice.common.long_poll``'s, as the security snapshot's: answered at once with every
quota when the coordinator's quota version differs from ours, else held until a change or
``max_wait_ms``. While the coordinator cannot be reached the service keeps enforcing the last quotas
it had (before the first answer: none, so nothing is
throttled by a coordinator that cannot be reached: quotas fail open, unlike ACLs, because they
protect capacity, not data).
"""

from __future__ import annotations

import logging

from prometheus_client import Gauge

from sluice.common.long_poll import DEFAULT_MAX_WAIT_MS, RPC_SLACK_S, CoordinatorLongPoll
from sluice.common.peers import AioPeers
from sluice.quotas.model import snapshot_from_proto
from sluice.quotas.throttle import QuotaManager
from sluice.v1 import quota_pb2

__all__ = ["QuotaPoller"]

log = logging.getLogger(__name__)

QUOTA_VERSION = Gauge("sluice_quota_version", "The quota snapshot version this process enforces")


class QuotaPoller(CoordinatorLongPoll):
    """One service's copy of the quotas, applied to ``manager``. Use from one event loop."""

    what = "quotas"

    def __init__(
        self, coordinator_address: str, manager: QuotaManager, *, max_wait_ms: int = DEFAULT_MAX_WAIT_MS
    ) -> None:
        super().__init__(coordinator_address, max_wait_ms=max_wait_ms)
        self.manager = manager
        self.version = 0

    async def poll_once(self, peers: AioPeers) -> bool:
        wait_ms = self.wait_ms
        response: quota_pb2.WatchQuotasResponse = await peers.quotas(self.target).WatchQuotas(
            quota_pb2.WatchQuotasRequest(known_version=self.version, max_wait_ms=wait_ms),
            timeout=wait_ms / 1000 + RPC_SLACK_S,
        )
        self.synced.set()
        if not response.changed:
            return False
        snapshot = snapshot_from_proto(response.quotas, response.version)
        self.manager.replace(snapshot)
        self.version = response.version
        QUOTA_VERSION.set(response.version)
        log.info("quota version %d: %d quotas", response.version, len(snapshot))
        return True
