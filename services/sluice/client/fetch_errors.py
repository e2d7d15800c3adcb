"""What the fetcher does about a partition's error in an answer.

OFFSET_OUT_OF_RANGE follows ``auto_offset_reset``: "earliest" or "latest" reset the position
through ListOffsets; "none" raises OffsetOutOfRange from ``fetch()`` and pauses the partition
until ``seek()``. Routing errors (NOT_LEADER, UNKNOWN_TOPIC_OR_PARTITION, an unreachable broker)
and other retriable ones back off and refresh the metadata; OFFSET_NOT_AVAILABLE (a new leader's
HW catching up) backs off only. Anything else pauses the partition and is raised from ``fetch()``.
"""

from __future__ import annotations

import logging
import time

from sluice.client.fetch_state import AutoOffsetReset, PartitionState, TopicPartition, backoff
from sluice.client.metadata import MetadataCache
from sluice.client.offsets import list_offsets
from sluice.common.peers import Peers
from sluice.errors import (
    BrokerNotAvailable,
    NotLeader,
    OffsetNotAvailable,
    OffsetOutOfRange,
    RequestTimedOut,
    SluiceError,
    StorageError,
    UnknownTopicOrPartition,
)
from sluice.v1 import broker_pb2

__all__ = ["PartitionErrors"]

log = logging.getLogger("sluice.fetcher")

#: Partition errors retried after a metadata refresh (an unknown partition may be one being created).
_RETRIABLE_PARTITION_ERRORS: tuple[type[SluiceError], ...] = (
    NotLeader,
    UnknownTopicOrPartition,
    BrokerNotAvailable,
    StorageError,
    RequestTimedOut,
)


class PartitionErrors:
    """Handles a partition's error for one fetcher; fatal ones go to its ``errors`` list."""

    def __init__(
        self,
        channels: Peers,
        metadata: MetadataCache,
        reset: AutoOffsetReset,
        request_timeout: float,
        errors: list[SluiceError],
    ) -> None:
        self.channels = channels
        self.metadata = metadata
        self.reset = reset
        self.request_timeout = request_timeout
        self.errors = errors

    def handle(
        self, tp: TopicPartition, st: PartitionState, pr: broker_pb2.FetchPartitionResponse, err: SluiceError
    ) -> bool:
        """Act on ``err`` of ``tp``; True when the fetcher must refresh its metadata."""
        if isinstance(err, OffsetOutOfRange):
            if self.reset == "none":
                st.paused = True
                self.errors.append(
                    OffsetOutOfRange(
                        f"{tp[0]}[{tp[1]}]: offset {st.position} is out of range "
                        f"[{pr.log_start_offset}, {pr.high_watermark}]; seek() to resume",
                        topic=tp[0],
                        partition=tp[1],
                        offset=st.position,
                        log_start_offset=pr.log_start_offset,
                        high_watermark=pr.high_watermark,
                    )
                )
                return False
            offsets = list_offsets(
                self.channels,
                self.metadata,
                tp[0],
                self.reset,
                partitions=[tp[1]],
                timeout=self.request_timeout,
            )
            log.info(
                "%s[%d]: offset %d out of range, reset to %s offset %d",
                tp[0],
                tp[1],
                st.position,
                self.reset,
                offsets[tp[1]],
            )
            st.position = offsets[tp[1]]
            return False
        if isinstance(err, OffsetNotAvailable):  # a new leader's HW catching up: the leader is right
            st.failures += 1
            st.backoff_until = time.monotonic() + backoff(st.failures)
            return False
        if isinstance(err, _RETRIABLE_PARTITION_ERRORS) or err.retriable:
            st.failures += 1
            st.backoff_until = time.monotonic() + backoff(st.failures)
            return True
        st.paused = True
        self.errors.append(type(err)(f"{tp[0]}[{tp[1]}]: {err.message}", topic=tp[0], partition=tp[1]))
        return False
