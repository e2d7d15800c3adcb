"""Controlled shutdown (Kafka's): on SIGTERM, before anything stops, the broker asks the controller to move
every leadership it holds to another in-sync replica and to take it out of the in-sync sets
(``ControlledShutdown``), then waits until it leads no replicated partition, and only then stops.

Why: a broker that just stops leaves its partitions leaderless until its session expires (seconds), and a
follower that just stops holds up acks=all writes until the leader drops it from the ISR
(``replica_lag_time_max_ms``). Moved beforehand, the clients see one NOT_LEADER per partition, refresh their
metadata and go on; the leaderless time is one push of the controller. docs/replication.md, "Controlled
shutdown".

Bounded: the controller answers once the replicas applied the move, naming the partitions that had no
other eligible replica (they stay led here); the broker asks again after a short pause, until none remain,
none has another live replica that may catch up (every other replica is down or stopping too: the last
broker of a stopping cluster stops at once), or ``--controlled-shutdown-timeout`` passes; then it stops
anyway (the session expiry handles what is left).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from sluice.broker.coordinator_link import RPC_TIMEOUT_S, CoordinatorLink
from sluice.common.peers import AioPeers
from sluice.common.rpc import error_from_rpc
from sluice.common.timeouts import within
from sluice.v1 import coordinator_pb2

log = logging.getLogger(__name__)

__all__ = ["controlled_shutdown"]

#: Pause between two asks while partitions remain (or the controller was unreachable).
RETRY_PAUSE_S = 0.5
#: Unanswered asks in a row before giving up: a controller that is down (a cluster stopped coordinator
#: first, a test's teardown) must not hold every broker's stop for the whole timeout.
MAX_FAILURES = 2


async def controlled_shutdown(
    link: CoordinatorLink, led: Callable[[], int], changed: asyncio.Event, timeout_s: float
) -> int:
    """Ask until this broker leads no replicated partition, at most ``timeout_s``. ``led``: how many it
    leads now; ``changed``: set by every applied partition update (cleared here). Returns the number still
    led when it gave up (0: done)."""
    if timeout_s <= 0 or not link.registered.is_set():
        return led()
    started = time.monotonic()
    deadline = started + timeout_s
    peers = AioPeers(max_peers=1)
    attempts = failures = 0
    try:
        while True:
            attempts += 1
            answer = await _ask(link, peers, deadline)
            failures = 0 if answer is not None else failures + 1
            remaining, may_move = answer if answer is not None else (1 << 30, 1)
            # The answer comes once the replicas applied the move; our own copy of the push may still be
            # on its way (or lost: then the next heartbeat's full assignment brings it).
            while led() > remaining and time.monotonic() < deadline:
                changed.clear()
                try:
                    await within(changed.wait(), min(RPC_TIMEOUT_S, deadline - time.monotonic()))
                except TimeoutError:
                    break
            now_led = led()
            if now_led == 0 or may_move == 0 or failures >= MAX_FAILURES:
                break
            if time.monotonic() + RETRY_PAUSE_S >= deadline:
                break
            await asyncio.sleep(RETRY_PAUSE_S)
    finally:
        await peers.close()
    took = time.monotonic() - started
    if now_led == 0:
        log.info("controlled shutdown done in %.3fs (%d ask(s)): leading 0 partitions", took, attempts)
    else:
        log.warning(
            "controlled shutdown gave up after %.3fs (%d ask(s)): still leading %d partitions",
            took,
            attempts,
            now_led,
        )
    return now_led


async def _ask(link: CoordinatorLink, peers: AioPeers, deadline: float) -> tuple[int, int] | None:
    """One ControlledShutdown call: (the partitions the controller says remain here, how many of them
    another replica may still take); None: no answer."""
    timeout = max(0.1, min(deadline - time.monotonic(), 2 * RPC_TIMEOUT_S))
    request = coordinator_pb2.ControlledShutdownRequest(
        broker_id=link.broker_id, broker_epoch=link.broker_epoch
    )
    try:
        answer = await peers.coordinator(link.address).ControlledShutdown(request, timeout=timeout)
    except grpc.RpcError as exc:
        log.warning("controlled shutdown: the controller did not answer: %s", error_from_rpc(exc))
        return None
    return len(answer.remaining), answer.may_move
