"""Upgrade step: register the positions written before topics had a refs registry. Reads only.

Offsets, cursors and subscription-registry entries written by an offset store older than topic identity
are in no topic's refs hash, so a later delete would leave them behind, and a re-created topic would start
from them (the silent skip that topic identity removes). Once per Redis (the marker
``{P}:coordinator:refs-adopted``) the coordinator scans the offset and cursor keys and the registry,
registers each in the refs of every topic it holds data of, and purges the topics that no longer exist, as
their delete would have. The scan is ``O(keys)``; it runs at startup, before
the coordinator serves, and never again.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection

from redis.asyncio import Redis

from sluice.coordinator.ops import RedisOp
from sluice.offsetstore.keys import REF_FIELDS, REF_INDEX, REF_KEY, Keys, topic_field_prefix

__all__ = ["adopt_legacy_positions", "adoption_marker", "legacy_ops"]

log = logging.getLogger(__name__)

_SCAN_COUNT = 1000
#: Key operations per fenced write (bounds one Lua call's arguments).
_BATCH = 5_000


def adoption_marker(keys: Keys) -> str:
    return f"{keys.prefix}:coordinator:refs-adopted"


def _topic_of_field(field: bytes) -> str | None:
    topic, slash, partition = field.decode(errors="replace").rpartition("/")
    return topic if slash and topic and partition.isdigit() else None


async def legacy_ops(redis: Redis, keys: Keys, live_topics: Collection[str]) -> list[RedisOp]:
    """The registrations of every offset and cursor key, then a ``PURGE`` of each topic that does not
    exist; empty when the marker says this Redis was adopted already."""
    if await redis.exists(adoption_marker(keys)):
        return []
    refs: dict[str, dict[str, str]] = defaultdict(dict)
    async for raw in redis.scan_iter(match=f"{keys.prefix}:off:*", count=_SCAN_COUNT):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        kind = await redis.type(raw)
        if kind in (b"hash", "hash"):
            for field in await redis.hkeys(raw):
                topic = _topic_of_field(field if isinstance(field, bytes) else str(field).encode())
                if topic is not None:
                    refs[topic][key] = REF_FIELDS
        elif kind in (b"set", "set") and key.endswith(":members"):
            prefix = keys.member_hash_prefix(key)
            for member in await redis.smembers(raw):
                m = member.decode() if isinstance(member, bytes) else str(member)
                for field in await redis.hkeys(prefix + m):
                    topic = _topic_of_field(field if isinstance(field, bytes) else str(field).encode())
                    if topic is not None:
                        refs[topic][key] = REF_INDEX + prefix
    async for raw in redis.scan_iter(match=f"{keys.prefix}:cur:*", count=_SCAN_COUNT):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        topic = keys.cursor_topic(key)
        if topic:
            refs[topic][key] = REF_KEY
    # The registry of durable subscriptions: its ``topic/subscription`` fields are their topics' data.
    for field in await redis.hkeys(keys.subscriptions()):
        name = field.decode(errors="replace") if isinstance(field, bytes) else str(field)
        topic, slash, _ = name.partition("/")
        if slash and topic:
            refs[topic][keys.subscriptions()] = REF_FIELDS
    ops = [
        RedisOp("HSET", keys.topic_refs(topic), key, how)
        for topic, entries in sorted(refs.items())
        for key, how in sorted(entries.items())
    ]
    ops += [
        RedisOp("PURGE", keys.topic_refs(topic), topic_field_prefix(topic))
        for topic in sorted(refs)
        if topic not in live_topics
    ]
    ops.append(RedisOp("SET", adoption_marker(keys), "1"))
    return ops


async def adopt_legacy_positions(
    redis: Redis,
    keys: Keys,
    live_topics: Collection[str],
    write: Callable[[list[RedisOp]], Awaitable[None]],
) -> None:
    """Compute ``legacy_ops`` and apply them with ``write`` (the coordinator's fenced write), in batches;
    the marker is the last operation, so a crash midway starts over next time (every step is idempotent)."""
    ops = await legacy_ops(redis, keys, live_topics)
    if not ops:
        return
    for i in range(0, len(ops), _BATCH):
        await write(ops[i : i + _BATCH])
    purged = sum(1 for op in ops if op.op == "PURGE")
    log.info(
        "adopted %d position keys into topic refs; purged %d deleted topics", len(ops) - purged - 1, purged
    )
