"""The Redis keys of topic identity, derived from the cluster records of one write. Pure.

They land in the coordinator's fenced write together with the records (``store.py``), so what the offset
store checks is always exactly the coordinator's view (docs/redis-schema.md):

- ``{P}:topic:{T}:id``   the current incarnation's ``topic_id``: SET when the topic record is written
  (created, grown), DELeted with the topic. The offset store refuses every position write whose
  ``topic_id`` is not this one, so nothing of a deleted incarnation can be written after the delete;
- ``{P}:topic:{T}:refs`` the keys holding the topic's offsets and cursors: the delete removes their
  data and the registry itself (``PURGE``, the Lua of ``offsetstore.keys.TOPIC_PURGE_LUA``).

A re-created topic therefore starts with no offsets and no cursors for any group or subscription, and a
deleted one leaves nothing of its own in Redis.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sluice.coordinator.cluster.records import TopicRecord
from sluice.coordinator.ops import RedisOp
from sluice.coordinator.records import Record, Tombstone
from sluice.offsetstore.keys import REF_FIELDS, Keys, split_field, topic_field_prefix

__all__ = ["copy_registrations", "topic_ops", "topic_sync_ops"]


def topic_ops(records: Iterable[Record], keys: Keys) -> list[RedisOp]:
    """The identity keys that follow the topic records (and tombstones) among ``records``."""
    ops: list[RedisOp] = []
    for record in records:
        if isinstance(record, TopicRecord):
            ops.append(RedisOp("SET", keys.topic_id(record.name), record.topic_id))
        elif isinstance(record, Tombstone) and record.type == TopicRecord.TYPE:
            name = record.id
            ops.append(RedisOp("DEL", keys.topic_id(name)))
            ops.append(RedisOp("PURGE", keys.topic_refs(name), topic_field_prefix(name)))
    return ops


def copy_registrations(ops: Sequence[RedisOp], keys: Keys) -> list[RedisOp]:
    """Register every hash an ``HCOPY`` writes a topic's offsets into (a split track's offsets, copied
    from its source track) in that topic's refs, so deleting the topic removes the copies too."""
    out: list[RedisOp] = []
    seen: set[tuple[str, str]] = set()
    for op in ops:
        if op.op != "HCOPY":
            continue
        topic, _ = split_field(op.b)
        if (topic, op.key) not in seen:
            seen.add((topic, op.key))
            out.append(RedisOp("HSET", keys.topic_refs(topic), op.key, REF_FIELDS))
    return out


def topic_sync_ops(topics: Iterable[TopicRecord], keys: Keys) -> list[RedisOp]:
    """At startup: every live topic's id key, whatever Redis held (also fills them in for topics created
    before the keys existed, whose writers would otherwise be refused)."""
    return [RedisOp("SET", keys.topic_id(t.name), t.topic_id) for t in topics]
