"""Durable positions in Redis: group offsets and push-subscription cursors.

The storage layer knows keys, Lua and Redis errors, and nothing of protobuf.
It does not validate input (the service layer does) but it does enforce every
rule that needs Redis state atomically: fencing by member epoch and partition
owner, increase-only commits, resets only while a group is empty, and cursor
fencing by owner epoch. Every request is one script call or one pipeline.

Redis failures become :class:`~sluice.errors.StorageError` (retriable), or, for a
write whose answer was lost (it may have run), :class:`~sluice.errors.CommitOutcomeUnknown`
(retriable too: every write here is idempotent); one rate-limited warning, never one per
request (``common/redis_client.py``, ``redis_errors``). The client reconnects by itself: a
dead connection is dropped from the pool and the next command opens a new one; a script
missing after a Redis restart is loaded again on ``NOSCRIPT``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from sluice.common.log_limit import RateLimitedWarning
from sluice.common.redis_client import redis_errors
from sluice.errors import (
    GroupNotEmpty,
    NotEnoughReplicas,
    NotOwner,
    SluiceError,
    StaleMemberEpoch,
    StorageError,
    UnknownMember,
)
from sluice.offsetstore import scripts
from sluice.offsetstore.keys import Keys, partition_field, split_field
from sluice.offsetstore.model import CommitOutcome, CursorKey, MessageModel, OffsetCommit, TopicPartition
from sluice.offsetstore.subscriptions import SubscriptionRecord, SubscriptionRegistry
from sluice.offsetstore.topic_identity import TopicRefusal, parse_save_result, topic_error
from sluice.v1 import common_pb2

log = logging.getLogger(__name__)

NO_OFFSET = -1


@dataclass(frozen=True, slots=True)
class CursorBlob:
    """A stored cursor as bytes, with the epoch of the dispatcher that owns it."""

    blob: bytes
    owner_epoch: int


@dataclass(frozen=True, slots=True)
class FetchedOffsets:
    """Committed offsets, and the current ``topic_id`` of each of their topics that exists."""

    offsets: dict[TopicPartition, int]
    topic_ids: dict[str, str]
    #: The leader epoch committed with each offset that has one (KIP-320; clustering offsets only).
    leader_epochs: dict[TopicPartition, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReplicaWait:
    """How many Redis replicas must hold a write before it is acknowledged (``WAIT``), and how long to wait.

    Redis replicates asynchronously: a write the primary acknowledged can be missing on the replica a
    Sentinel promotes. ``WAIT n`` after the write, on the same connection, returns how many replicas have
    it; fewer than asked means the write may not survive a failover, so it is answered NOT_ENOUGH_REPLICAS
    (retriable: commits only increase and cursors are fenced by epoch, so the retry is safe).
    """

    replicas: int = 0
    timeout_ms: int = 2000


class PositionStore:
    """Group offsets and cursors in Redis, every write fenced in Lua."""

    def __init__(self, client: aioredis.Redis, keys: Keys, wait: ReplicaWait | None = None) -> None:
        self._redis = client
        self.keys = keys
        self._wait = wait or ReplicaWait()
        self._commit = client.register_script(scripts.COMMIT)
        self._reset = client.register_script(scripts.RESET)
        self._save_cursors = client.register_script(scripts.SAVE_CURSORS)
        self._subscriptions = SubscriptionRegistry(client, keys)
        self._warn = RateLimitedWarning(log)

    def _storage_errors(self, what: str, write: bool = False) -> AbstractAsyncContextManager[None]:
        """Redis failures as typed retriable errors (``redis_errors``); ``write``: one that may have run
        when its answer is lost is CommitOutcomeUnknown, never taken as stored or as refused."""
        return redis_errors(what, self._warn, write=write)

    async def load_scripts(self) -> None:
        """SCRIPT LOAD every script now, so requests only ever send EVALSHA."""
        async with self._storage_errors("loading Lua scripts"):
            for script in (self._commit, self._reset, self._save_cursors):
                script.sha = await self._redis.script_load(script.script)

    async def ping(self) -> bool:
        try:
            return bool(await self._redis.ping())
        except RedisError:
            return False

    async def close(self) -> None:
        await self._redis.aclose()

    # ---- group offsets ---------------------------------------------------------

    async def commit(
        self,
        group: str,
        member_id: str,
        member_epoch: int,
        commits: Sequence[OffsetCommit],
        model: MessageModel = MessageModel.CLUSTERING,
    ) -> list[CommitOutcome]:
        """Apply a commit atomically; return one outcome per entry, in order.

        Clustering: each partition must be owned by ``member_id`` at
        ``member_epoch``. Broadcasting: the member must exist at that epoch, and
        the offsets go to its own hash. Either way a lower offset is ignored and
        the stored one returned.
        """
        if not commits:
            return []
        k = self.keys
        broadcasting = model is MessageModel.BROADCASTING
        keys = [k.members(group)]
        key_index: dict[str, int] = {}
        topic_index: dict[str, int] = {}
        argv: list[str | int] = ["member" if broadcasting else "group", member_id, member_epoch]
        for c in commits:
            index = key_index.get(c.track)
            if index is None:
                index = len(keys) + 1  # Lua arrays are 1-based
                key_index[c.track] = index
                if broadcasting:
                    keys.append(k.member_offsets(group, c.track, member_id))
                else:
                    keys.append(k.offsets(group, c.track))
                keys.append(k.member_index(group, c.track))
                keys.append(k.owners(group, c.track))
                keys.append(k.leader_epochs(group, c.track))
            t = topic_index.get(c.topic)
            if t is None:
                t = topic_index[c.topic] = len(keys) + 1
                keys += [k.topic_id(c.topic), k.topic_refs(c.topic)]
            epoch = str(c.leader_epoch) if c.leader_epoch >= 0 else ""
            argv += [index, t, partition_field(c.topic, c.partition), c.offset, c.topic_id, epoch]
        async with self._storage_errors(f"committing offsets of group {group!r}", write=True):
            (raw,) = await self._evalsha_pipeline(self._commit, [[len(keys), *keys, *argv]])
        current = _text(raw[0])
        outcomes = []
        for i, c in enumerate(commits):
            code, stored, detail = int(raw[1 + 3 * i]), int(raw[2 + 3 * i]), _text(raw[3 + 3 * i])
            error = _commit_error(
                code,
                group=group,
                member_id=member_id,
                member_epoch=member_epoch,
                current=current,
                commit=c,
                detail=detail,
            )
            outcomes.append(CommitOutcome(c.topic, c.partition, stored, error))
        return outcomes

    async def fetch(
        self,
        group: str,
        track: str,
        partitions: Sequence[TopicPartition] = (),
        member_id: str = "",
    ) -> FetchedOffsets:
        """Committed offsets; every partition with one when ``partitions`` is empty.

        With ``member_id`` (broadcasting), the member's own offsets win and the
        track's shared offsets (what a reset sets) fill in the rest. Listed
        partitions without an offset map to ``NO_OFFSET``. The topics' current
        ids are read in the same transaction, so they name the incarnation the
        offsets belong to (a purge by a topic delete cannot fall in between).
        """
        k = self.keys
        sources = [k.offsets(group, track)]
        if member_id:
            sources.append(k.member_offsets(group, track, member_id))
        if not partitions:
            async with self._storage_errors(f"listing offsets of group {group!r}"):
                listed: set[str] = set()
                for key in sources:
                    listed.update(_text(f) for f in await self._redis.hkeys(key))
            found = [TopicPartition(*split_field(f)) for f in sorted(listed)]
            if not found:
                return FetchedOffsets({}, {})
            fetched = await self.fetch(group, track, found, member_id)
            present = {tp: off for tp, off in fetched.offsets.items() if off != NO_OFFSET}
            return FetchedOffsets(present, fetched.topic_ids, fetched.leader_epochs)
        fields = [partition_field(tp.topic, tp.partition) for tp in partitions]
        topics = sorted({tp.topic for tp in partitions})
        async with (
            self._storage_errors(f"fetching offsets of group {group!r}"),
            self._redis.pipeline(transaction=True) as pipe,
        ):
            for key in sources:
                pipe.hmget(key, fields)
            pipe.hmget(k.leader_epochs(group, track), fields)
            pipe.mget([k.topic_id(t) for t in topics])
            *replies, epochs, ids = await pipe.execute()
        merged = dict.fromkeys(partitions, NO_OFFSET)
        for reply in replies:  # later sources (the member's) override
            for tp, value in zip(partitions, reply, strict=True):
                if value is not None:
                    merged[tp] = int(value)
        topic_ids = {t: _text(i) for t, i in zip(topics, ids, strict=True) if i is not None}
        # A member's own offset (broadcasting) has no epoch: the track's epoch goes with the track's offset.
        own = replies[1] if member_id else [None] * len(partitions)
        leader_epochs = {
            tp: int(e)
            for tp, e, mine in zip(partitions, epochs, own, strict=True)
            if e is not None and mine is None and merged[tp] != NO_OFFSET
        }
        return FetchedOffsets(merged, topic_ids, leader_epochs)

    async def live_members(self, group: str) -> int:
        async with self._storage_errors(f"reading the live members of group {group!r}"):
            raw = await self._redis.get(self.keys.live(group))
        try:
            return int(raw) if raw is not None else 0
        except ValueError:
            return 0

    async def reset(
        self, group: str, track: str, offsets: Mapping[TopicPartition, int], topic_ids: Mapping[str, str]
    ) -> None:
        """Set offsets exactly (not increase-only), all in one script; refused while members are live,
        and unless every topic exists (as the incarnation ``topic_ids[topic]`` when given)."""
        k = self.keys
        topics = sorted({tp.topic for tp in offsets})
        keys = [k.live(group), k.offsets(group, track), k.member_index(group, track)]
        argv: list[str | int] = [k.member_offsets_prefix(group, track), len(topics)]
        for topic in topics:
            keys += [k.topic_id(topic), k.topic_refs(topic)]
            argv.append(topic_ids.get(topic, ""))
        for tp, offset in sorted(offsets.items(), key=lambda kv: (kv[0].topic, kv[0].partition)):
            argv += [partition_field(tp.topic, tp.partition), offset]
        keys.append(k.leader_epochs(group, track))  # last: a reset offset has no leader epoch
        async with self._storage_errors(f"resetting offsets of group {group!r}", write=True):
            (raw,) = await self._evalsha_pipeline(self._reset, [[len(keys), *keys, *argv]])
        code = int(raw[0])
        if code == common_pb2.GROUP_NOT_EMPTY:
            raise group_not_empty(group, int(raw[1]))
        if code != common_pb2.NONE:
            topic = topics[int(raw[2]) - 1]
            raise topic_error(
                TopicRefusal(code, _text(raw[1])),
                topic,
                topic_ids.get(topic, ""),
                f"reset of group {group!r}",
            )

    # ---- cursors ---------------------------------------------------------------

    async def save_cursors(
        self, writes: Sequence[tuple[CursorKey, int, bytes, str]]
    ) -> list[int | TopicRefusal | None]:
        """Write encoded cursors (key, owner epoch, blob, topic_id); per write, None when saved, the
        epoch that fenced it, or the refusal for its topic (deleted or re-created meanwhile).

        One script call per subscription (its keys share a hash slot), all in
        one pipeline: one round trip for the whole batch.
        """
        by_subscription: dict[str, list[int]] = defaultdict(list)
        for i, (key, _epoch, _blob, _topic_id) in enumerate(writes):
            by_subscription[key.subscription].append(i)
        k = self.keys
        calls: list[list[str | int | bytes]] = []
        for indexes in by_subscription.values():
            keys: list[str | int | bytes] = []
            argv: list[str | int | bytes] = []
            for i in indexes:
                ck, epoch, blob, topic_id = writes[i]
                keys += [
                    k.cursor(ck.subscription, ck.topic, ck.partition),
                    k.cursor_epoch(ck.subscription, ck.topic, ck.partition),
                    k.topic_id(ck.topic),
                    k.topic_refs(ck.topic),
                ]
                argv += [epoch, blob, topic_id]
            calls.append([len(keys), *keys, *argv])
        async with self._storage_errors("saving cursors", write=True):
            replies = await self._evalsha_pipeline(self._save_cursors, calls)
        results: list[int | TopicRefusal | None] = [None] * len(writes)
        for indexes, reply in zip(by_subscription.values(), replies, strict=True):
            for i, raw in zip(indexes, reply, strict=True):
                results[i] = parse_save_result(_text(raw))
        return results

    async def _evalsha_pipeline(self, script: AsyncScript, calls: list[list[str | int | bytes]]) -> list[Any]:
        """Run ``script`` once per argument list in one pipeline (one round trip).

        Unlike redis-py's pipeline script support this does not send SCRIPT
        EXISTS first; a NOSCRIPT reply (Redis restarted) loads the script and
        replays the batch, which is safe because a NOSCRIPT call did nothing
        and the other calls are idempotent (same epochs, same blobs).

        Every write goes through here, so the replica guard (:class:`ReplicaWait`) is one ``WAIT`` at the
        end of the same pipeline: one connection (WAIT counts that connection's writes) and no extra
        round trip.
        """
        wait = self._wait
        for attempt in (1, 2):
            async with self._redis.pipeline(transaction=False) as pipe:
                for argv in calls:
                    pipe.evalsha(script.sha, *argv)  # type: ignore[arg-type]  # argv[0] is numkeys
                if wait.replicas:
                    pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
                replies: list[Any] = await pipe.execute(raise_on_error=False)
            if attempt == 1 and any(isinstance(r, NoScriptError) for r in replies):
                script.sha = await self._redis.script_load(script.script)
                continue
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            if wait.replicas:
                acknowledged = int(replies.pop())
                if acknowledged < wait.replicas:
                    raise NotEnoughReplicas(
                        f"written on the Redis primary but held by {acknowledged} of the "
                        f"{wait.replicas} replicas asked for within {wait.timeout_ms} ms: a failover could "
                        "lose it; retry"
                    )
            return replies
        raise AssertionError("unreachable")

    async def load_cursor(self, key: CursorKey) -> CursorBlob | None:
        k = self.keys
        async with self._storage_errors(f"loading cursor {key}"):
            blob, epoch = await self._redis.mget(
                [
                    k.cursor(key.subscription, key.topic, key.partition),
                    k.cursor_epoch(key.subscription, key.topic, key.partition),
                ]
            )
        if blob is None:
            return None
        return CursorBlob(blob if isinstance(blob, bytes) else blob.encode(), int(epoch or 0))

    # ---- the registry of durable subscriptions (subscriptions.py) ------------

    async def touch_subscriptions(self, records: Sequence[SubscriptionRecord]) -> list[TopicRefusal | None]:
        async with self._storage_errors("registering subscriptions", write=True):
            return await self._subscriptions.touch(records)

    async def list_subscriptions(self, topic: str = "") -> list[SubscriptionRecord]:
        async with self._storage_errors("listing subscriptions"):
            return await self._subscriptions.list(topic)

    async def delete_subscription(
        self, topic: str, subscription: str, partitions: Sequence[int], unregister: bool
    ) -> int:
        async with self._storage_errors(f"deleting subscription {topic}/{subscription}", write=True):
            return await self._subscriptions.delete(topic, subscription, partitions, unregister)


def group_not_empty(group: str, live: int) -> GroupNotEmpty:
    return GroupNotEmpty(
        f"group {group!r} has {live} live member(s); offsets can be reset only while it is empty: "
        "stop its consumers (or let their session time out) and retry",
        group=group,
        live=live,
    )


def _commit_error(
    code: int,
    *,
    group: str,
    member_id: str,
    member_epoch: int,
    current: str,
    commit: OffsetCommit,
    detail: str,
) -> SluiceError | None:
    tp = partition_field(commit.topic, commit.partition)
    if code == common_pb2.NONE:
        return None
    if code in (common_pb2.UNKNOWN_TOPIC_ID, common_pb2.UNKNOWN_TOPIC_OR_PARTITION):
        return topic_error(
            TopicRefusal(code, detail), commit.topic, commit.topic_id, f"commit of {tp} by group {group!r}"
        )
    if code == common_pb2.UNKNOWN_MEMBER:
        return UnknownMember(
            f"member {member_id!r} is not in group {group!r} (it left, was removed after its session "
            "timeout, or the group does not exist): rejoin with a heartbeat before committing",
            group=group,
            member_id=member_id,
        )
    if code == common_pb2.STALE_MEMBER_EPOCH:
        return StaleMemberEpoch(
            f"member {member_id!r} of group {group!r} committed {tp} with epoch {member_epoch} but its "
            f"current epoch is {current}: a fenced (zombie) member cannot commit; heartbeat to get the "
            "current epoch and assignment",
            group=group,
            member_id=member_id,
            member_epoch=member_epoch,
        )
    if code == common_pb2.NOT_OWNER:
        owner = detail
        held = f"owned by member {owner!r}" if owner else "not owned by anyone (unassigned or in handoff)"
        return NotOwner(
            f"member {member_id!r} does not own {tp} in group {group!r}: it is {held}",
            group=group,
            member_id=member_id,
            topic=commit.topic,
            partition=commit.partition,
        )
    return StorageError(f"unexpected commit result code {code} for {tp}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes | bytearray) else str(value)
