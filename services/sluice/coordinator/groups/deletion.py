"""DeleteGroup: remove a group that has no members, with everything it left in Redis.

What a group leaves behind: its records in the coordinator's hash (``grpconfig``, ``group``, and any
member records), its ownership keys (``{P}:grp:{G}:*``) and its committed offsets on every track and of
every broadcasting member (``{P}:off:{G}:*``). The tracks a group has used are not all in its records
(a track retired long ago, a reset on a track nobody read), so the keys are found by ``SCAN`` over the
group's two key patterns; every key of one group shares its hash tag, and group names cannot hold glob
characters, so the patterns match exactly that group's keys.

The scan runs before the write (it may take a while on a big keyspace, and must not block Redis or the
coordinator's write lock); the write then checks, under the lock, that the group still has no members
and deletes the records and the keys found in one fenced script. A member that joins in between makes
the delete fail with GROUP_NOT_EMPTY. (Kafka's DeleteGroups refuses NON_EMPTY_GROUP the same way.)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from sluice.coordinator.groups.records import group_tombstones
from sluice.coordinator.groups.redis_ops import RedisOp
from sluice.coordinator.groups.state import GroupsState
from sluice.coordinator.records import Record, Result
from sluice.errors import GroupNotEmpty, StorageError, UnknownGroup
from sluice.offsetstore.keys import Keys

__all__ = ["GroupKeysFound", "delete_group", "deletion_ops", "find_group_keys"]

#: SCAN page size, and how long finding one group's keys may take before the delete gives up.
SCAN_COUNT = 1000
SCAN_DEADLINE_S = 20.0


@dataclass(frozen=True)
class GroupKeysFound:
    keys: tuple[str, ...]
    #: Committed offsets in them (fields of the offset hashes).
    offsets: int
    #: The topics those offsets are of: the keys are unregistered from their refs (topic identity).
    topics: frozenset[str] = frozenset()


async def find_group_keys(redis: Redis, keys: Keys, group: str) -> GroupKeysFound:
    """Every Redis key of ``group`` and how many committed offsets they hold."""
    found: list[str] = []
    deadline = time.monotonic() + SCAN_DEADLINE_S
    try:
        for pattern in keys.group_patterns(group):
            cursor = 0
            while True:
                cursor, page = await redis.scan(cursor, match=pattern, count=SCAN_COUNT)
                found.extend(k.decode() if isinstance(k, bytes) else str(k) for k in page)
                if cursor == 0:
                    break
                if time.monotonic() > deadline:
                    raise StorageError(
                        f"finding the keys of group {group!r} took over {SCAN_DEADLINE_S:.0f}s (a very large "
                        "Redis keyspace); nothing was deleted, retry"
                    )
        found = sorted(set(found))
        # The leader-epoch side hashes (``…:le``) sit beside the offsets they annotate: deleted with the
        # group, not counted as committed offsets.
        offset_keys = [
            k
            for k in found
            if k.startswith(keys.offsets(group, "")) and not k.endswith(_LEADER_EPOCHS_SUFFIX)
        ]
        async with redis.pipeline(transaction=False) as pipe:
            for k in offset_keys:
                pipe.type(k)
            types = await pipe.execute()
            hashes = [k for k, t in zip(offset_keys, types, strict=True) if t in (b"hash", "hash")]
            for k in hashes:
                pipe.hkeys(k)
            fields = [_text(f) for reply in await pipe.execute() for f in reply]
    except RedisError as exc:
        raise StorageError(f"cannot list the keys of group {group!r}: {exc}") from exc
    topics = frozenset(f.rpartition("/")[0] for f in fields if "/" in f)
    return GroupKeysFound(tuple(found), len(fields), topics)


_LEADER_EPOCHS_SUFFIX = Keys("p").leader_epochs("g", "t").removeprefix(Keys("p").offsets("g", "t"))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def delete_group(state: GroupsState, group: str, found: GroupKeysFound) -> Result[int]:
    """The tombstones that delete ``group`` (its member records first: replay drops the group with its
    metadata tombstone). Pure. Returns the number of committed offsets deleted."""
    g = state.groups.get(group)
    if g is not None and g.members:
        raise GroupNotEmpty(
            f"group {group!r} has {len(g.members)} active member(s); a group can be deleted only while it "
            "is empty: stop its consumers (or let their sessions time out) and retry",
            group=group,
            members=len(g.members),
        )
    if g is None and not found.keys:
        raise UnknownGroup(f"group {group!r} does not exist (no members, no committed offsets)")
    records: list[Record] = []
    if g is not None:
        records += group_tombstones(group, set(g.targets) | set(g.current))
    return Result(found.offsets, tuple(records))


def deletion_ops(found: GroupKeysFound, keys: Keys) -> Sequence[RedisOp]:
    """DEL every key found, and unregister them from the refs of the topics they held offsets of (so a
    topic's registry names only keys that hold its data: docs/redis-schema.md, "Topic identity")."""
    ops = [RedisOp("DEL", key) for key in found.keys]
    ops += [RedisOp("HDEL", keys.topic_refs(t), key) for t in sorted(found.topics) for key in found.keys]
    return ops
