"""The registry of durable subscriptions in a real offset store: touches merge, listing, deletion."""

from __future__ import annotations

import grpc
import pytest

from sluice.v1 import common_pb2
from sluice.v1 import offset_store_pb2 as pb
from tests.integration.offsetstore.conftest import Stack, topic_id_of


def touch(stack: Stack, *subs: pb.StoredSubscription) -> list[int]:
    """Touch ``subs`` (their topics made to exist first); the per-record error codes."""
    stack.seed_topic(*{s.topic for s in subs if s.topic != "gone-topic"})
    resp = stack.stub.TouchSubscriptions(pb.TouchSubscriptionsRequest(subscriptions=subs), timeout=10)
    return [e.code for e in resp.errors]


def stored(stack: Stack, topic: str = "") -> list[pb.StoredSubscription]:
    return list(
        stack.stub.ListStoredSubscriptions(pb.ListStoredSubscriptionsRequest(topic=topic)).subscriptions
    )


def sub(topic: str, name: str, created: int, active: int, filt: str = "*") -> pb.StoredSubscription:
    return pb.StoredSubscription(
        topic=topic, subscription=name, type=1, filter=filt, created_ms=created, last_active_ms=active
    )


def test_touches_keep_the_first_creation_and_the_latest_activity(stack: Stack) -> None:
    # Two dispatchers of one topic touch the same entry, in any order.
    touch(stack, sub("reg-t", "s", 1_700_000_000_123, 1_700_000_000_500, "a || b"))
    touch(stack, sub("reg-t", "s", 1_800_000_000_000, 1_700_000_000_400, "a || b"))
    touch(stack, sub("reg-t", "other", 5, 6), sub("reg-u", "s", 7, 8))
    (other, entry) = stored(stack, "reg-t")  # sorted by name
    assert (entry.subscription, entry.created_ms, entry.last_active_ms) == (
        "s",
        1_700_000_000_123,
        1_700_000_000_500,
    )
    assert entry.filter == "a || b", "a filter with '|' survives the encoding"
    assert (other.subscription, other.created_ms, other.last_active_ms) == ("other", 5, 6)
    assert {(s.topic, s.subscription) for s in stored(stack)} >= {
        ("reg-t", "s"),
        ("reg-t", "other"),
        ("reg-u", "s"),
    }


def test_delete_removes_the_cursors_then_the_entry(stack: Stack) -> None:
    touch(stack, sub("reg-d", "gone", 1, 2))
    stack.stub.SaveCursors(
        pb.SaveCursorsRequest(
            cursors=[
                pb.Cursor(topic="reg-d", partition=p, subscription="gone", mark_delete=3, owner_epoch=1)
                for p in (0, 1)
            ]
        ),
        timeout=10,
    )
    assert len(stack.redis.keys("sluice:cur:{gone}:reg-d/*")) == 4
    resp = stack.stub.DeleteSubscriptionState(
        pb.DeleteSubscriptionStateRequest(
            topic="reg-d", subscription="gone", partitions=[0, 1, 2], unregister=True
        )
    )
    assert resp.deleted_keys == 5  # 2 cursors, 2 epochs, 1 registry field
    assert stack.redis.keys("sluice:cur:{gone}:*") == []
    assert stored(stack, "reg-d") == []
    # Unregistered from the topic's refs too: only the registry hash (other subscriptions) stays named.
    assert stack.redis.hgetall("sluice:topic:{reg-d}:refs") == {b"sluice:subs": b"h"}


def test_a_touch_is_checked_by_topic_id_and_registered_in_the_topics_refs(stack: Stack) -> None:
    """Topic identity: a registry entry is per-topic state. A touch for a topic that is gone, or for an
    older incarnation, writes nothing (a late touch must not re-register a deleted topic's subscription);
    a written one registers ``{P}:subs`` in the topic's refs, so the topic's delete purges the entry."""
    live = sub("reg-i", "s", 1, 2)
    live.topic_id = topic_id_of("reg-i")
    stale = sub("reg-i", "old", 1, 2)
    stale.topic_id = "id-of-a-deleted-incarnation"
    gone = sub("gone-topic", "s", 1, 2)
    codes = touch(stack, live, stale, gone)
    assert codes == [common_pb2.NONE, common_pb2.UNKNOWN_TOPIC_ID, common_pb2.UNKNOWN_TOPIC_OR_PARTITION]
    assert [s.subscription for s in stored(stack, "reg-i")] == ["s"]
    assert stored(stack, "gone-topic") == []
    assert stack.redis.hget("sluice:topic:{reg-i}:refs", "sluice:subs") == b"h"
    assert not stack.redis.exists("sluice:topic:{gone-topic}:refs")


def test_bad_names_are_invalid_arguments(stack: Stack) -> None:
    for bad in (sub("bad topic", "s", 1, 1), sub("t", "a/b", 1, 1)):
        with pytest.raises(grpc.RpcError) as info:
            touch(stack, bad)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
