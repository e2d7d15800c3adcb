"""Keeps a broker's or dispatcher's quotas current: a long poll of the coordinator (WatchQuotas).

The same shape as ``sluice.security.watcher.SecurityWatcher``: answered at once with every quota
when the coordinator's quota version differs from ours, else held until a change or ``max_wait_ms``.
A standby's NOT_COORDINATOR names the leader, asked next at once; other failures back off, and the
service keeps enforcing the last quotas it had (before the first answer: none, so nothing is
throttled by a coordinator that cannot be reached: quotas fail open, unlike ACLs, because they
protect capacity, not data).
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
from sluice.quotas.model import snapshot_from_proto
from sluice.quotas.throttle import QuotaManager
from sluice.v1 import quota_pb2

__all__ = ["QuotaPoller"]

log = logging.getLogger(__name__)

QUOTA_VERSION = Gauge("sluice_quota_version", "The quota snapshot version this process enforces")

DEFAULT_MAX_WAIT_MS = 30_000
RPC_SLACK_S = 5.0
_LEADER_IS = re.compile(r"leader is (\S+:\d+)")


class QuotaPoller:
    """One service's copy of the quotas, applied to ``manager``. Use from one event loop."""

    def __init__(
        self, coordinator_address: str, manager: QuotaManager, *, max_wait_ms: int = DEFAULT_MAX_WAIT_MS
    ) -> None:
        self.coordinator_address = coordinator_address
        self.manager = manager
        self.max_wait_ms = max_wait_ms
        self.version = 0
        self.synced = asyncio.Event()
        self.target = coordinator_address
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="quota-watcher")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def run(self) -> None:
        backoff = Backoff()
        peers = AioPeers(max_peers=4)
        try:
            while True:
                try:
                    await self.poll_once(peers)
                    backoff.reset()
                    continue
                except grpc.RpcError as exc:
                    error: SluiceError = error_from_rpc(exc)
                except SluiceError as exc:
                    error = exc
                leader = _LEADER_IS.search(error.message) if isinstance(error, NotCoordinator) else None
                if leader is not None and leader.group(1) != self.target:
                    self.target = leader.group(1)
                    continue
                self.target = self.coordinator_address
                delay = backoff.next()
                log.warning("quotas from %s: %s; retrying in %.1fs", self.target, error, delay)
                await asyncio.sleep(delay)
        finally:
            await peers.close()

    async def poll_once(self, peers: AioPeers) -> bool:
        wait_ms = self.max_wait_ms if self.synced.is_set() else 0
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
