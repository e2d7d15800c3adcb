"""A service's copy of something the coordinator holds, kept current by a long poll.

The shape both such copies share (the security snapshot, ``security/watcher.py``; the quotas,
``quotas/poller.py``): one task calls a ``Watch*(known_version, max_wait_ms)`` RPC in a loop; the
coordinator answers at once when its version differs from ours, else holds the call until something
changes (or ``max_wait_ms`` passes). A subclass makes the one call and applies what came
(``poll_once``); this class owns the loop, finding the coordinator and backing off.

Finding the coordinator: the configured address (a Kubernetes Service, ``sluice up``'s port), as the
broker's ``CoordinatorLink`` does. A standby answers NOT_COORDINATOR naming the leader
(docs/election.md): the next poll goes to the named leader at once (one hop in a row; a second backs
off, so two standbys naming each other cannot ping-pong), and back to the configured address after any
other failure. Failures back off with the peer layer's ``Backoff``; meanwhile the service keeps what it
had.
"""

from __future__ import annotations

import asyncio
import logging
import re

import grpc

from sluice.common.backoff import Backoff
from sluice.common.log_limit import RateLimitedWarning
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc
from sluice.errors import NotCoordinator, SluiceError

__all__ = ["DEFAULT_MAX_WAIT_MS", "RPC_SLACK_S", "CoordinatorLongPoll"]

log = logging.getLogger(__name__)

#: How long one poll waits for a change on the coordinator (its own cap is 60 s).
DEFAULT_MAX_WAIT_MS = 30_000
#: Added to max_wait for the RPC deadline: the answer takes a moment to come back.
RPC_SLACK_S = 5.0
#: The leader a standby names in NOT_COORDINATOR (the message format is a contract: docs/election.md;
#: coordinator/election/guard.py writes it. Parsed here so a broker never imports the coordinator).
_LEADER_IS = re.compile(r"leader is (\S+:\d+)")


class CoordinatorLongPoll:
    """The loop of one long-polled copy. Use from one event loop."""

    #: What is polled, for the task's name and the log lines ("security snapshots", "quotas").
    what = "coordinator state"

    def __init__(
        self,
        coordinator_address: str,
        peers: AioPeers | None = None,
        *,
        max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
    ) -> None:
        self.coordinator_address = coordinator_address
        self.max_wait_ms = max_wait_ms
        self._peers = peers
        #: Set once the coordinator has answered (with a copy, or "you are current").
        self.synced = asyncio.Event()
        #: Where the next poll goes: the configured address, or the leader a standby named.
        self.target = coordinator_address
        self._task: asyncio.Task[None] | None = None
        #: An outage of the coordinator (or of its Redis) costs a few lines, not one per retry.
        self._warning = RateLimitedWarning(log, f"{self.what} from the coordinator")

    async def poll_once(self, peers: AioPeers) -> bool:
        """One Watch call to ``self.target``; applies what came. Returns whether anything did."""
        raise NotImplementedError

    @property
    def wait_ms(self) -> int:
        """This poll's wait: none until the first answer (a coordinator at version 0 holds what an
        empty copy already holds, and would otherwise keep ``synced`` waiting a whole poll)."""
        return self.max_wait_ms if self.synced.is_set() else 0

    def start(self) -> asyncio.Task[None]:
        if self._task is None:
            name = self.what.replace(" ", "-") + "-poll"
            self._task = asyncio.get_running_loop().create_task(self.run(), name=name)
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
                    self._warning.succeeded()
                    continue
                except grpc.RpcError as exc:
                    error: SluiceError = error_from_rpc(exc)
                except SluiceError as exc:  # an answer that does not decode
                    error = exc
                leader = _LEADER_IS.search(error.message) if isinstance(error, NotCoordinator) else None
                if leader is not None and not redirected and leader.group(1) != self.target:
                    redirected = True  # one hop at once; a second one in a row backs off (no ping-pong)
                    self.target = leader.group(1)
                    log.info("%s: following the coordinator leader at %s", self.what, self.target)
                    continue
                self.target = leader.group(1) if leader is not None else self.coordinator_address
                redirected = False
                self._warning.failed(f"polling {self.target}", error)
                await asyncio.sleep(backoff.next())
        finally:
            if self._peers is None:
                await peers.close()
