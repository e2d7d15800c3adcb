"""Positions checked against the current leader after a leader change (KIP-320), for the dispatcher.

The SDK's fetcher does the same (``client/fetch_validate.py``); here it runs on the dispatcher's event
loop, for two readers:

- **A feed** (``FeedEpochs``): before it reads again under a newer leader epoch than the one its position
  was last checked under, it asks the leader (``OffsetForLeaderEpoch``, ``replica_id`` -1,
  ``current_leader_epoch`` the new epoch) where the epoch of the last record it read ends. Below the
  feed's read end, the records between were truncated (only an unclean election does that: a leader
  elected from the in-sync set holds everything below the high watermark, which is all a feed reads),
  and the feed moves every subscription back to that end (``truncation.py``).
- **Loaded cursors** (``check_loaded``): a cursor persisted with an epoch older than the partition's
  leader epoch now is checked the same way before the subscription serves it, so a dispatcher that was
  down (or not serving the subscription) during the election still sees the truncation.

An answer below the position is the only thing that moves a position backwards, and it is logged and
counted (``sluice_dispatcher_log_truncations_total``), never silent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

import grpc

from sluice.codec.batch import BatchView
from sluice.common.peers import AioPeers, is_routing
from sluice.common.rpc import error_from_rpc
from sluice.dispatcher.cluster import ClusterView, CoordinatorLink
from sluice.dispatcher.cursor import PartitionCursor
from sluice.dispatcher.epochs import EpochTrail
from sluice.errors import BrokerNotAvailable, SluiceError, error_from_proto
from sluice.v1 import broker_pb2

log = logging.getLogger(__name__)

__all__ = ["FeedEpochs", "LoadedTruncation", "check_loaded", "leader_ends"]

RPC_TIMEOUT = 10.0
#: How long a subscription load keeps retrying a check that meets routing errors (as ListOffsets).
CHECK_RETRY_S = 10.0
_RETRY_PAUSE_S = 0.2

#: A loaded cursor the check moved back: (partition, its position, the leader's end of its epoch).
LoadedTruncation = tuple[int, int, int]


def _current(view: ClusterView, topic: str, partition: int) -> int:
    epoch = view.leader_epoch(topic, partition)
    return -1 if epoch is None else epoch


async def leader_ends(
    link: CoordinatorLink, channels: AioPeers, topic: str, asks: Mapping[int, int]
) -> dict[int, int]:
    """``{partition: end}``: where each partition's current leader ends the epoch asked for it
    (``asks``: ``{partition: epoch}``); 0 when its log has no epoch at or below it. Raises the first
    partition's error (a routing error: refresh the metadata and ask again)."""
    view = link.view
    by_broker: dict[str, list[int]] = {}
    for p in asks:
        by_broker.setdefault(link.broker_for(topic, p), []).append(p)
    out: dict[int, int] = {}
    for broker, partitions in by_broker.items():
        request = broker_pb2.OffsetForLeaderEpochRequest(
            replica_id=-1,
            partitions=[
                broker_pb2.OffsetForLeaderEpochPartition(
                    topic=topic,
                    partition=p,
                    leader_epoch=asks[p],
                    current_leader_epoch=_current(view, topic, p),
                )
                for p in partitions
            ],
        )
        try:
            resp = await channels.broker(broker).OffsetForLeaderEpoch(request, timeout=RPC_TIMEOUT)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from None
        for answer in resp.partitions:
            err = error_from_proto(answer.error)
            if err is not None:
                raise err
            # The SDK's rule: no epoch at or below the one asked means nothing of it is left.
            out[answer.partition] = answer.end_offset if answer.leader_epoch >= 0 else 0
    missing = [p for p in asks if p not in out]
    if missing:
        raise BrokerNotAvailable(f"no OffsetForLeaderEpoch answer for {topic} partitions {missing}")
    return out


class FeedEpochs:
    """A feed's leader epochs: what it read in which epoch, and the epoch its position was checked in."""

    __slots__ = ("checked", "partition", "topic", "trail")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.trail = EpochTrail()
        #: The leader epoch the feed read (or checked its position) under; -1: none yet.
        self.checked = -1

    def saw(self, views: Sequence[BatchView], next_offset: int) -> None:
        """One answer read (its batches, and where it ends): two comparisons unless an epoch begins."""
        trail = self.trail
        trail.end = max(trail.end, next_offset)
        if views and views[-1].header.partition_leader_epoch > trail.latest:
            trail.note_views(views)

    def stale(self, current: int | None) -> bool:
        """Whether the leader epoch moved past the one the position was checked under."""
        return current is not None and current > self.checked

    async def check(self, link: CoordinatorLink, channels: AioPeers) -> int | None:
        """Check the read end under the current leader; the truncation point, or None (no truncation).
        Raises a routing error when the leader must be asked again after a metadata refresh."""
        current = link.view.leader_epoch(self.topic, self.partition)
        if current is None:
            return None
        trail = self.trail
        read_end = trail.end
        # The epoch of the last record read: epochs only grow along the log.
        asked = trail.latest if read_end else -1
        if asked < 0 or asked >= current:  # nothing read with an epoch yet, or read in this one
            self.checked = current
            return None
        end = (await leader_ends(link, channels, self.topic, {self.partition: asked}))[self.partition]
        self.checked = current
        if end >= read_end:
            return None
        log.warning(
            "%s/%d: the leader in epoch %d ends epoch %d at %d, below what this dispatcher read (up to %d): "
            "records were truncated (unclean election); subscriptions move back to %d",
            self.topic,
            self.partition,
            current,
            asked,
            end,
            read_end,
            end,
        )
        trail.truncate(end)
        return end


async def check_loaded(
    link: CoordinatorLink, channels: AioPeers, topic: str, cursors: Mapping[int, PartitionCursor]
) -> list[LoadedTruncation]:
    """Check loaded cursors whose persisted epoch is older than their partition's leader epoch; truncate
    those the leader's log ends below. Routing errors are retried for ``CHECK_RETRY_S`` (refreshing the
    metadata), then raised: the Subscribe fails with a retriable error and the consumer tries again."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CHECK_RETRY_S
    while True:
        view = link.view
        asks: dict[int, int] = {}
        for p, c in cursors.items():
            current = view.leader_epoch(topic, p)
            if c.leader_epoch >= 0 and current is not None and current > c.leader_epoch:
                asks[p] = c.leader_epoch
        if not asks:
            return []
        seen = link.routing.generation
        try:
            ends = await leader_ends(link, channels, topic, asks)
            break
        except SluiceError as exc:
            if not (exc.retriable or is_routing(exc)) or loop.time() >= deadline:
                raise
            log.debug("checking loaded cursors of %s: %s; retried", topic, exc)
            await asyncio.sleep(_RETRY_PAUSE_S)
            await link.routing.refresh_after(seen)
    out: list[LoadedTruncation] = []
    for p, end in ends.items():
        c = cursors[p]
        position = max(c.mark_delete, c.acked.last_end)
        # The records below the position (or below the end) are in this leader's log: its epoch is the
        # one to persist from now on (a later epoch never reports a truncation that did not happen).
        current = view.leader_epoch(topic, p)
        c.epoch_covers = max(c.epoch_covers, position)
        if end < position:
            log.warning(
                "%s/%d: a persisted cursor at %d (read in leader epoch %d) is above where the leader in "
                "epoch %s ends that epoch (%d): records were truncated (unclean election); the cursor "
                "moves back to %d",
                topic,
                p,
                position,
                asks[p],
                current,
                end,
                end,
            )
            c.truncate(end)
            out.append((p, position, end))
        c.leader_epoch = asks[p] if current is None else current
        c.version += 1  # persist the checked epoch
    return out
