"""The topic-identity key operations of a coordinator write (cluster/redis_ops.py): pure."""

from __future__ import annotations

from sluice.coordinator.cluster.model import TopicConfig
from sluice.coordinator.cluster.records import new_topic_record, new_topic_tombstone
from sluice.coordinator.cluster.redis_ops import copy_registrations, topic_ops, topic_sync_ops
from sluice.coordinator.groups.redis_ops import RedisOp
from sluice.offsetstore.keys import Keys

KEYS = Keys("p")


def test_a_created_topic_sets_its_id_and_a_deleted_one_is_purged_in_the_same_write() -> None:
    created = new_topic_record("orders", "id1", (1, 2), TopicConfig(), 0)
    assert topic_ops([created], KEYS) == [RedisOp("SET", "p:topic:{orders}:id", "id1")]
    assert topic_ops([new_topic_tombstone("orders")], KEYS) == [
        RedisOp("DEL", "p:topic:{orders}:id"),
        RedisOp("PURGE", "p:topic:{orders}:refs", "orders/"),
    ]


def test_every_hcopy_destination_is_registered_once_in_its_topics_refs() -> None:
    ops = [
        RedisOp("HCOPY", "p:off:{g}:t1", "p:off:{g}:default", "orders/0"),
        RedisOp("HCOPY", "p:off:{g}:t1", "p:off:{g}:default", "orders/1"),
        RedisOp("HCOPY", "p:off:{g}:t1", "p:off:{g}:default", "orders.v2/0"),
        RedisOp("HSET", "p:grp:{g}:owners", "orders/0", "m1"),
    ]
    assert copy_registrations(ops, KEYS) == [
        RedisOp("HSET", "p:topic:{orders}:refs", "p:off:{g}:t1", "h"),
        RedisOp("HSET", "p:topic:{orders.v2}:refs", "p:off:{g}:t1", "h"),
    ]


def test_startup_sets_every_recovered_topics_id() -> None:
    topics = [new_topic_record(n, f"id-{n}", (1,), TopicConfig(), 0) for n in ("a", "b")]
    assert topic_sync_ops(topics, KEYS) == [
        RedisOp("SET", "p:topic:{a}:id", "id-a"),
        RedisOp("SET", "p:topic:{b}:id", "id-b"),
    ]
