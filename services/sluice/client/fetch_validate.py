"""Truncation detection after a leader change (KIP-320), for the fetcher.

Every fetch carries the leader epoch the fetcher last saw in Metadata (``PartitionState.leader_epoch``),
and a partition remembers the epoch its records were last fetched under (``fetched_epoch``). When a
metadata refresh shows a newer leader epoch for a partition that has fetched records, the position is
checked before the partition is fetched again: the new leader is asked where ``fetched_epoch`` ends in
its log (``OffsetForLeaderEpoch``, ``current_leader_epoch`` = the new epoch). An answer below the position
means the records between that end and the position are not in the new leader's log (an unclean
election lost them): the position goes back to that end, with a warning, and the truncation is counted
(``PositionValidator.truncations``), instead of reading past it into records that were never the ones
fetched. Otherwise the position stands.

The epoch of the *fetch* is used, not the epoch stamped on the last fetched batch: every batch a leader
serves in epoch E carries an epoch <= E, and the consumer only ever reads up to the high watermark, so the
records below the position were in the leader's log for epoch E; the new leader's end of E (the start of
its next epoch) is exactly where the two logs stop agreeing about them. It saves walking every batch
header of every answer for its epoch.

This is the only way a position moves backwards, and it only happens when records were truly removed
(docs/consumer.md, "Across a failover").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import grpc

from sluice.client.fetch_state import PartitionState, TopicPartition, backoff
from sluice.client.metadata import MetadataCache
from sluice.common.peers import Peers, is_routing
from sluice.common.rpc import error_from_rpc
from sluice.errors import RequestTimedOut, SluiceError, error_from_proto
from sluice.v1 import broker_pb2, broker_pb2_grpc

__all__ = ["PositionValidator", "check_positions"]

log = logging.getLogger("sluice.fetcher")


class PositionValidator:
    """Checks positions against a new leader's log; fatal errors go to ``errors``."""

    def __init__(self, channels: Peers, request_timeout: float, errors: list[SluiceError]) -> None:
        self.channels = channels
        self.request_timeout = request_timeout
        self.errors = errors
        #: Positions moved back because the new leader's log ends earlier (records truly truncated).
        self.truncations = 0
        #: Positions checked after a leader change.
        self.validations = 0
        #: Some partition waits for its check (set from ``place``'s answer).
        self.pending = False

    def run(
        self, parts: Mapping[TopicPartition, PartitionState], leaders: Mapping[TopicPartition, str | None]
    ) -> bool:
        """``validate``, keeping ``pending``; True when the metadata must be refreshed."""
        self.pending = self.validate(parts, leaders)
        return self.pending

    def validate(
        self, parts: Mapping[TopicPartition, PartitionState], leaders: Mapping[TopicPartition, str | None]
    ) -> bool:
        """Check every partition marked ``validate`` with its leader; True when some are left to check
        (a leader unknown, moved or not yet aware of its epoch): refresh the metadata, and retry after
        their backoff."""
        by_leader: dict[str, list[TopicPartition]] = {}
        now = time.monotonic()
        stale = False
        for tp, st in parts.items():
            if not st.validate or st.paused or st.backoff_until > now:
                continue
            address = leaders.get(tp)
            if address is None:
                stale = True
                continue
            by_leader.setdefault(address, []).append(tp)
        for address, tps in by_leader.items():
            stale = self._ask(address, tps, parts) or stale
        return stale or any(st.validate and not st.paused for st in parts.values())

    def _ask(
        self, address: str, tps: list[TopicPartition], parts: Mapping[TopicPartition, PartitionState]
    ) -> bool:
        request = broker_pb2.OffsetForLeaderEpochRequest(
            replica_id=-1,
            partitions=[
                broker_pb2.OffsetForLeaderEpochPartition(
                    topic=tp[0],
                    partition=tp[1],
                    leader_epoch=parts[tp].fetched_epoch,
                    current_leader_epoch=parts[tp].leader_epoch,
                )
                for tp in tps
            ],
        )
        try:
            stub = self.channels.stub(address, broker_pb2_grpc.BrokerStub)
            resp = stub.OffsetForLeaderEpoch(request, timeout=self.request_timeout)
        except grpc.RpcError as exc:
            return self._retry_later(tps, parts, error_from_rpc(exc))
        except SluiceError as exc:
            return self._retry_later(tps, parts, exc)
        stale = False
        for answer in resp.partitions:
            tp = (answer.topic, answer.partition)
            st = parts.get(tp)
            if st is None or tp not in tps:
                continue
            err = error_from_proto(answer.error)
            if err is not None:
                stale = self._retry_later([tp], parts, err) or stale
                continue
            self._check(tp, st, answer)
        return stale

    def _check(
        self, tp: TopicPartition, st: PartitionState, answer: broker_pb2.OffsetForLeaderEpochPartitionResponse
    ) -> None:
        self.validations += 1
        st.validate = False
        st.failures = 0
        end = answer.end_offset if answer.leader_epoch >= 0 else 0
        if end < st.position:
            log.warning(
                "%s[%d]: the new leader (epoch %d) ends epoch %d at %d, below the position %d: records "
                "were truncated (unclean election); fetching again from %d",
                tp[0],
                tp[1],
                st.leader_epoch,
                st.fetched_epoch,
                end,
                st.position,
                end,
            )
            self.truncations += 1
            st.position = end
        st.fetched_epoch = st.leader_epoch

    def _retry_later(
        self, tps: list[TopicPartition], parts: Mapping[TopicPartition, PartitionState], err: SluiceError
    ) -> bool:
        if not err.retriable and not is_routing(err):
            for tp in tps:
                parts[tp].paused = True
            self.errors.append(err)
            return False
        log.debug("position check of %s failed, retried: %s", tps, err)
        for tp in tps:
            st = parts[tp]
            st.failures += 1
            st.backoff_until = time.monotonic() + backoff(st.failures)
        return True


def check_positions(
    channels: Peers,
    metadata: MetadataCache,
    positions: Mapping[TopicPartition, tuple[int, int]],
    timeout: float,
) -> dict[TopicPartition, int]:
    """A one-shot check, for readers that keep their positions themselves (the Spark source's planner):
    ``positions`` maps a partition to ``(offset, the leader epoch of the records before it)`` (-1: not
    checked); returns the offsets after the check, as the fetcher would move them (one is lower only when
    the current leader's log ends below it). Partitions whose leader epoch did not change are not asked.
    Routing errors are retried with a metadata refresh until ``timeout``, then raised."""
    errors: list[SluiceError] = []
    validator = PositionValidator(channels, timeout, errors)
    topics = sorted({tp[0] for tp in positions})
    md = metadata.get(topics, refresh=True)
    parts: dict[TopicPartition, PartitionState] = {}
    for tp, (offset, epoch) in positions.items():
        st = parts[tp] = PartitionState(offset, leader_epoch=md.leader_epoch(*tp))
        st.seek(offset, epoch)
    deadline = time.monotonic() + timeout
    while validator.validate(parts, {tp: md.leader_address(*tp) for tp in parts}):
        if errors:
            raise errors[0]
        if time.monotonic() >= deadline:
            raise RequestTimedOut(f"could not check positions of {sorted(parts)} with their leaders in time")
        time.sleep(0.1)
        md = metadata.get(topics, refresh=True)
        for tp, st in parts.items():
            st.leader_epoch = md.leader_epoch(*tp)
    if errors:
        raise errors[0]
    return {tp: st.position for tp, st in parts.items()}
