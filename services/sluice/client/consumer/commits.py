"""The consumer's offset-store client: committed-offset lookups and fenced commits.

The offset store's address comes from the coordinator's Metadata. Commits carry the
member id and epoch (the store refuses zombies per partition: STALE_MEMBER_EPOCH,
UNKNOWN_MEMBER, NOT_OWNER) and each partition's offset *track*. Broadcasting members
mark their commits with ``message_model = MESSAGE_MODEL_BROADCASTING`` and
look offsets up with their member id (their own offsets, the shared ones as fallback).

Topic identity: a lookup answers each topic's current ``topic_id`` along with the offsets (read
atomically together), and every later commit of that partition carries it. If the topic is deleted, or
deleted and re-created, meanwhile, the store refuses the commit with ``UnknownTopicId`` instead of
writing an old topic's position into the new one.

Caller: the Consumer (sync from the application thread) and its AsyncCommitter (gRPC futures).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import grpc

from sluice.client.metadata import MetadataCache
from sluice.client.offsets import list_offsets
from sluice.client.rpc import call, error_from_rpc
from sluice.common.backoff import Backoff
from sluice.common.peers import Peers
from sluice.errors import (
    BrokerNotAvailable,
    CommitOutcomeUnknown,
    RequestTimedOut,
    SluiceError,
    error_from_proto,
)
from sluice.v1 import common_pb2, coordinator_pb2, offset_store_pb2, offset_store_pb2_grpc

__all__ = ["BACKOFF_FIRST", "BACKOFF_MAX", "CommitResult", "OffsetStoreClient", "gave_up", "in_doubt"]

TopicPartition = tuple[str, int]
#: tp -> None (stored) or the refusal.
CommitResult = dict[TopicPartition, SluiceError | None]
#: Commit retries: the peer layer's ``Backoff`` with tighter bounds (50 ms doubling to 1 s) than its
#: reconnects, because a commit waits on the caller's ``poll()`` or close: a store that is back is used
#: again within 1 s.
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 1.0


class OffsetStoreClient:
    def __init__(
        self,
        channels: Peers,
        metadata: MetadataCache,
        group: str,
        topics: Iterable[str],
        request_timeout: float,
        broadcasting: bool = False,
    ) -> None:
        self._channels = channels
        self._metadata = metadata
        self._group = group
        self._topics = sorted(set(topics))
        self._timeout = request_timeout
        self.broadcasting = broadcasting
        #: tp -> the topic_id its committed offset was looked up for (sent with its commits).
        self._topic_ids: dict[TopicPartition, str] = {}
        #: tp -> the leader epoch of the records handed out last (KIP-320's committed leader epoch, sent
        #: with its commits), or the one committed with the offset it started from. The epoch of the
        #: latest records, also for a lower committable offset: epochs only grow, and a later epoch
        #: can only under-detect a truncation, never invent one (docs/consumer.md, "Across a failover").
        self.leader_epochs: dict[TopicPartition, int] = {}

    def stub(self, refresh: bool = False) -> offset_store_pb2_grpc.OffsetStoreStub:
        """The offset store's stub, from the (cached) Metadata."""
        address = None if refresh else self._metadata.current().offset_store
        if address is None:
            address = self._metadata.get(self._topics, refresh=True).offset_store
        if address is None:
            raise BrokerNotAvailable(
                "the cluster has no offset store: the coordinator's Metadata names none "
                "(start one with `sluice offset-store` and pass --offset-store to the coordinator)"
            )
        return self._channels.stub(address, offset_store_pb2_grpc.OffsetStoreStub)

    # ---- lookups -------------------------------------------------------------------------------------

    def fetch(self, tracks: Mapping[TopicPartition, str], member_id: str = "") -> dict[TopicPartition, int]:
        """Committed offsets (-1: none) of ``tracks`` ({tp: track}); one request per track.

        Retries while the offset store is unreachable, up to the request timeout.
        """
        by_track: dict[str, list[TopicPartition]] = {}
        for tp, track in tracks.items():
            by_track.setdefault(track, []).append(tp)
        out: dict[TopicPartition, int] = {}
        for track, tps in sorted(by_track.items()):
            request = offset_store_pb2.FetchOffsetsRequest(
                group=self._group,
                partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(tps)],
                track=track,
                member_id=member_id if self.broadcasting else "",
            )
            resp = self._fetch_one(request)
            found = {(o.topic, o.partition): o.offset for o in resp.offsets}
            ids = {o.topic: o.topic_id for o in resp.offsets if o.topic_id}
            epochs = {
                (o.topic, o.partition): o.leader_epoch for o in resp.offsets if o.HasField("leader_epoch")
            }
            for tp in tps:
                out[tp] = found.get(tp, -1)
                self._topic_ids[tp] = ids.get(tp[0], "")
                self.leader_epochs[tp] = epochs.get(tp, -1)
        return out

    def _fetch_one(
        self, request: offset_store_pb2.FetchOffsetsRequest
    ) -> offset_store_pb2.FetchOffsetsResponse:
        resp: offset_store_pb2.FetchOffsetsResponse = self._retrying(
            lambda stub: call(stub.FetchOffsets, request, self._timeout)
        )
        return resp

    def reset_positions(self, missing: Iterable[TopicPartition], reset: str) -> dict[TopicPartition, int]:
        """Where ``auto_offset_reset`` starts partitions with nothing committed ("earliest" /
        "latest" through ListOffsets; "none": nowhere, the caller raises)."""
        by_topic: dict[str, list[int]] = {}
        for topic, p in missing:
            by_topic.setdefault(topic, []).append(p)
        out: dict[TopicPartition, int] = {}
        if reset == "none":
            return out
        for topic, ps in sorted(by_topic.items()):
            found = list_offsets(
                self._channels, self._metadata, topic, reset, partitions=ps, timeout=self._timeout
            )
            out.update({(topic, p): off for p, off in found.items()})
        return out

    # ---- commits -------------------------------------------------------------------------------------

    def request(
        self, member_id: str, member_epoch: int, offsets: Mapping[TopicPartition, tuple[int, str]]
    ) -> offset_store_pb2.CommitOffsetsRequest:
        return offset_store_pb2.CommitOffsetsRequest(
            group=self._group,
            member_id=member_id,
            member_epoch=member_epoch,
            message_model=(
                coordinator_pb2.MESSAGE_MODEL_BROADCASTING
                if self.broadcasting
                else coordinator_pb2.MESSAGE_MODEL_CLUSTERING
            ),
            offsets=[
                offset_store_pb2.PartitionOffset(
                    topic=t,
                    partition=p,
                    offset=off,
                    track=track,
                    topic_id=self._topic_ids.get((t, p), ""),
                    leader_epoch=_epoch_or_none(self.leader_epochs.get((t, p), -1)),
                )
                for (t, p), (off, track) in sorted(offsets.items())
            ],
        )

    def commit(self, request: offset_store_pb2.CommitOffsetsRequest) -> CommitResult:
        """Send a commit and wait; retried while the store is unreachable (commits are
        idempotent: increase-only). Refusals come back per partition. Out of time after an
        attempt whose outcome is unknown (the store answered COMMIT_OUTCOME_UNKNOWN, or no answer
        came in time): ``CommitOutcomeUnknown``, never success (and not a plain timeout either:
        the commit may be stored)."""
        resp = self._retrying(lambda stub: call(stub.CommitOffsets, request, self._timeout), write=True)
        return results(resp)

    def commit_async(
        self,
        request: offset_store_pb2.CommitOffsetsRequest,
        done: Callable[[CommitResult | SluiceError], None],
        refresh: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Send a commit without waiting; ``done`` gets the results or the RPC's error (on a
        gRPC thread; here when no stub could be had). ``refresh`` looks the store's address up
        again first. No retries here: the AsyncCommitter retries, coalescing as it goes."""
        try:
            future = self.stub(refresh).CommitOffsets.future(
                request, timeout=self._timeout if timeout is None else timeout
            )
        except SluiceError as exc:
            done(exc)
            return

        def finished(f: grpc.Future[Any]) -> None:
            try:
                done(results(f.result()))
            except grpc.RpcError as exc:
                done(error_from_rpc(exc))
            except grpc.FutureCancelledError:
                done(BrokerNotAvailable("commit cancelled"))

        future.add_done_callback(finished)

    def _retrying(
        self, fn: Callable[[offset_store_pb2_grpc.OffsetStoreStub], Any], write: bool = False
    ) -> Any:
        deadline = time.monotonic() + self._timeout
        backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX)
        refresh = False
        doubt = False
        while True:
            try:
                return fn(self.stub(refresh))
            except SluiceError as exc:
                if not exc.retriable:
                    raise
                doubt = doubt or (write and in_doubt(exc))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise gave_up(self._timeout, exc, doubt) from exc
                # A backoff, not a poll: nothing to wait on while the store is away.
                time.sleep(min(backoff.next(), remaining))
                refresh = isinstance(exc, BrokerNotAvailable)


def in_doubt(error: SluiceError) -> bool:
    """A commit attempt that may have been stored: the store said so (its Redis write lost its answer),
    or no answer came within the deadline (the store may have written it after)."""
    return isinstance(error, CommitOutcomeUnknown | RequestTimedOut)


def gave_up(timeout: float, last: SluiceError, doubt: bool) -> SluiceError:
    """The error of a commit out of retries: in doubt if any attempt was (a retry that was refused as
    never sent does not undo an earlier attempt that may have been stored)."""
    if doubt:
        return CommitOutcomeUnknown(
            f"commit not confirmed within {timeout:g} s and an attempt may have been stored "
            f"(last: {last.message}); commit again: it is idempotent"
        )
    return RequestTimedOut(f"offset store unreachable for {timeout:g} s: {last.message}")


def results(resp: offset_store_pb2.CommitOffsetsResponse) -> CommitResult:
    out: CommitResult = {}
    for r in resp.results:
        out[(r.topic, r.partition)] = error_from_proto(r.error, f"{r.topic}[{r.partition}]")
    return out


def _epoch_or_none(epoch: int) -> int | None:
    """-1 (unknown) is left out of a commit (the offset store then keeps no epoch for it)."""
    return epoch if epoch >= 0 else None
