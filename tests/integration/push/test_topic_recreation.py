"""Topic identity: a deleted topic leaves nothing in Redis, a re-created one starts clean for every old
group and subscription, and a writer still holding the old topic's position cannot write it into the new
one (docs/redis-schema.md, "Topic identity").

A private cluster (redis, coordinator, broker, offset store, dispatcher): the Redis inventory is compared
before and after, so no other test may write to this Redis meanwhile.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis

from sluice import Client
from sluice.client.rpc import call
from sluice.coordinator.groups.tracks import track_id
from sluice.errors import UnknownTopicOrPartition
from sluice.v1 import common_pb2, coordinator_pb2, offset_store_pb2, offset_store_pb2_grpc
from tests.harness import ROOT, _env
from tests.integration.push.conftest import PushCluster
from tests.integration.push.helpers import eventually, produce
from tests.integration.push.identity_helpers import (
    bindings,
    consume_as_old_group,
    consume_as_old_subscription,
    idle_in_registry,
    inventory,
    join_track,
    not_loaded,
    own,
    rds,
    split_group_with_idle_tag_b,
    text,
)

__all__ = ["own", "rds"]  # the fixtures, imported for pytest

TAG_B_TRACK = track_id("tagB")


def test_recreated_topic_starts_clean_and_the_delete_leaves_nothing(
    own: PushCluster, rds: redis.Redis
) -> None:
    topic, group, sub, split = "recreated", "old-group", "old-sub", "old-split"
    with Client(own.bootstrap, request_timeout=10) as client:
        # The groups and the subscription exist before the topic does (they read another topic first), so
        # everything of their own is in the "before" inventory and only the topic's data can differ.
        client.admin.create_topic("elsewhere", partitions=1)
        produce(client, "elsewhere", 1)
        assert consume_as_old_group(client, "elsewhere", group, 1) == [b"0"]
        assert consume_as_old_subscription(client, "elsewhere", sub, 1) == [b"0"]
        eventually(lambda: rds.exists(f"sluice:cur:{{{sub}}}:elsewhere/0") == 1, what="cursor saved")
        # The same split layout on "elsewhere": the tagB track's keys (offsets, handover) exist before.
        assert split_group_with_idle_tag_b(own, client, split, "elsewhere") == TAG_B_TRACK
        eventually(lambda: idle_in_registry(own, client, "elsewhere", sub), what="idle subscription")
        before = inventory(rds)

        client.admin.create_topic(topic, partitions=1)
        produce(client, topic, 3)
        assert consume_as_old_group(client, topic, group, 3) == [b"0", b"1", b"2"]
        assert consume_as_old_subscription(client, topic, sub, 3) == [b"0", b"1", b"2"]
        # What used to make a re-created topic skip its first records: both positions are at 3.
        assert rds.hget(f"sluice:off:{{{group}}}:default", f"{topic}/0") == b"3"
        eventually(lambda: rds.exists(f"sluice:cur:{{{sub}}}:{topic}/0") == 1, what="cursor saved")
        # A split group whose tagB member is away: its track and handover are kept by filter, idle.
        split_group_with_idle_tag_b(own, client, split, topic)
        tag_b = f"sluice:off:{{{split}}}:{TAG_B_TRACK}"
        assert rds.hget(f"{tag_b}:handover", f"{topic}/0") == b"4"  # handed the tagA position
        assert rds.hget(tag_b, f"{topic}/0") == b"6"
        [idle_b] = [b for b in bindings(client, split, topic) if b.filter == "tagB"]
        assert (idle_b.track, idle_b.members, idle_b.source_track) == (TAG_B_TRACK, 0, "default")
        assert idle_b.idle_since_ms > 0
        # The durable subscription has no consumer any more: unloaded, listed from the registry.
        eventually(lambda: idle_in_registry(own, client, topic, sub), what="idle subscription")
        assert rds.hexists("sluice:subs", f"{topic}/{sub}")
        registered = {text(k) for k in rds.hkeys(f"sluice:topic:{{{topic}}}:refs")}
        assert registered == {
            f"sluice:off:{{{group}}}:default",
            f"sluice:off:{{{group}}}:default:le",  # the committed leader epochs (KIP-320)
            f"sluice:cur:{{{sub}}}:{topic}/0",
            f"sluice:cur:{{{sub}}}:{topic}/0:epoch",
            f"sluice:off:{{{split}}}:default",
            tag_b,
            f"{tag_b}:handover",
            "sluice:subs",
        }

        client.admin.delete_topic(topic)
        # The dispatcher forgets the idle subscription when it sees the delete; a late touch or cursor
        # save is refused by the offset store, so nothing comes back after the purge.
        eventually(lambda: not_loaded(own, client, topic, sub), timeout=15, what="subscription forgotten")
        after = inventory(rds)
        assert len(after) == len(before)
        assert after == before, f"left behind: {sorted(after - before)}; removed: {sorted(before - after)}"
        # The group records forgot the topic's bindings (and so their handovers) in the same write.
        assert bindings(client, split, topic) == []
        assert [b.track for b in bindings(client, split, "elsewhere")] == ["default", TAG_B_TRACK]

        client.admin.create_topic(topic, partitions=1)
        # More records than the old positions (3), so a leftover position would skip the first three
        # rather than fall off the log end (which auto_offset_reset would mend).
        fresh = [b"new-%d" % i for i in range(5)]
        with client.producer(topic, linger="1ms") as p:
            for value in fresh:
                p.send(value)
            p.flush()
        assert consume_as_old_group(client, topic, group, 5) == fresh
        assert consume_as_old_subscription(client, topic, sub, 5) == fresh
        # A returning tagB member starts the new topic afresh: the first filter takes the default track
        # (no old binding resumed, no handover from the old topic's tagA position).
        assert join_track(client, split, topic, "tagB") == "default"
        [fresh_b] = bindings(client, split, topic)
        assert (fresh_b.filter, fresh_b.source_track, dict(fresh_b.handover_offsets)) == ("tagB", "", {})
        # Deleted again, it leaves nothing either (and the dispatcher goes quiet for the next test).
        client.admin.delete_topic(topic)
        eventually(lambda: not_loaded(own, client, topic, sub), timeout=15, what="subscription forgotten")
        assert inventory(rds) == before


def _commit(
    store: offset_store_pb2_grpc.OffsetStoreStub, group: str, topic: str, offset: int, topic_id: str
) -> offset_store_pb2.PartitionOffsetResult:
    """A broadcasting commit (membership checked, no partition owner needed) of ``topic``/0."""
    request = offset_store_pb2.CommitOffsetsRequest(
        group=group,
        member_id="zombie",
        member_epoch=1,
        message_model=coordinator_pb2.MESSAGE_MODEL_BROADCASTING,
        offsets=[
            offset_store_pb2.PartitionOffset(topic=topic, partition=0, offset=offset, topic_id=topic_id)
        ],
    )
    [result] = call(store.CommitOffsets, request, timeout=10).results
    return result


def _save(
    store: offset_store_pb2_grpc.OffsetStoreStub, sub: str, topic: str, mark: int, topic_id: str
) -> common_pb2.Error:
    cursor = offset_store_pb2.Cursor(
        topic=topic, partition=0, subscription=sub, mark_delete=mark, owner_epoch=1, topic_id=topic_id
    )
    request = offset_store_pb2.SaveCursorsRequest(cursors=[cursor])
    [error] = call(store.SaveCursors, request, timeout=10).errors
    return error


def test_a_writer_holding_the_old_topics_position_is_fenced(own: PushCluster, rds: redis.Redis) -> None:
    """Races the purge alone cannot close: a consumer or dispatcher still holding the deleted topic's
    position writes it after the delete (it must not resurrect anything) or after the re-creation (it
    must not land in the new topic). Both are refused by topic_id, atomically with the check."""
    topic, group, sub = "fenced", "zombie-group", "zombie-sub"
    # A broadcasting member the coordinator knows (its membership key, as the group protocol writes it).
    rds.hset(f"sluice:grp:{{{group}}}:members", "zombie", "1")
    start = inventory(rds)
    with Client(own.bootstrap, request_timeout=10) as client:
        store = client._channels.stub(own.offset_store.address, offset_store_pb2_grpc.OffsetStoreStub)
        old = client.admin.create_topic(topic, partitions=1).topic_id
        assert _commit(store, group, topic, 5, old).error.code == common_pb2.NONE
        assert _save(store, sub, topic, 5, old).code == common_pb2.NONE
        fetched = call(
            store.FetchOffsets,
            offset_store_pb2.FetchOffsetsRequest(
                group=group, member_id="zombie", partitions=[common_pb2.TopicPartition(topic=topic)]
            ),
            timeout=10,
        )
        assert [(o.offset, o.topic_id) for o in fetched.offsets] == [(5, old)]
        assert rds.smembers(f"sluice:off:{{{group}}}:default:members") == {b"zombie"}

        client.admin.delete_topic(topic)
        # Offsets (and the member's emptied hash and index entry), cursor, epoch, registry: all gone.
        purged = inventory(rds)
        assert purged == start, (sorted(purged - start), sorted(start - purged))
        # After the delete: refused, and nothing is written (no key comes back).
        late = _commit(store, group, topic, 9, old)
        assert late.error.code == common_pb2.UNKNOWN_TOPIC_ID, late
        assert "was deleted" in late.error.message
        assert _save(store, sub, topic, 9, old).code == common_pb2.UNKNOWN_TOPIC_ID
        # Without a topic_id a write to a topic that does not exist is refused too.
        assert _commit(store, group, topic, 9, "").error.code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
        assert _save(store, sub, topic, 9, "").code == common_pb2.UNKNOWN_TOPIC_OR_PARTITION
        assert inventory(rds) == purged

        new = client.admin.create_topic(topic, partitions=1).topic_id
        assert new != old
        # After the re-creation: the old incarnation's positions stay out of the new topic.
        stale = _commit(store, group, topic, 9, old)
        assert stale.error.code == common_pb2.UNKNOWN_TOPIC_ID
        assert new in stale.error.message
        assert _save(store, sub, topic, 9, old).code == common_pb2.UNKNOWN_TOPIC_ID
        assert rds.hget(f"sluice:off:{{{group}}}:default:m:zombie", f"{topic}/0") is None
        assert rds.get(f"sluice:cur:{{{sub}}}:{topic}/0") is None
        # The new incarnation's writers go through, and the delete removes them again.
        assert _commit(store, group, topic, 1, new).error.code == common_pb2.NONE
        assert _save(store, sub, topic, 1, new).code == common_pb2.NONE
        client.admin.delete_topic(topic)
    assert inventory(rds) == start


def test_deleting_an_unknown_topic_is_a_typed_error(own: PushCluster) -> None:
    with Client(own.bootstrap, request_timeout=10) as client:
        with pytest.raises(UnknownTopicOrPartition, match="'never-was' does not exist"):
            client.admin.delete_topic("never-was")
        client.admin.create_topic("once", partitions=1)
        client.admin.delete_topic("once")
        with pytest.raises(UnknownTopicOrPartition, match="'once' does not exist"):
            client.admin.delete_topic("once")
    result = subprocess.run(
        [sys.executable, "-m", "sluice", "--bootstrap", own.bootstrap, "topic", "delete", "never-was"],
        capture_output=True,
        timeout=60,
        env=_env(),
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 1
    err = result.stderr.decode()
    assert err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION: "), err
    assert "never-was" in err
    assert "Traceback" not in err


def test_split_track_offsets_copied_by_the_coordinator_are_purged_too(
    own: PushCluster, rds: redis.Redis
) -> None:
    """The coordinator copies offsets into a split track's hash (HCOPY in its fenced write): that copy is
    registered like any other writer's, so the delete finds it while the group is still live."""
    topic, group = "split-copy", "split-group"
    with Client(own.bootstrap, request_timeout=10) as client:
        coordinator = client._metadata.coordinator_stub()
        store = client._channels.stub(own.offset_store.address, offset_store_pb2_grpc.OffsetStoreStub)
        topic_id = client.admin.create_topic(topic, partitions=1).topic_id
        call(
            coordinator.SetGroupConfig,
            coordinator_pb2.SetGroupConfigRequest(
                group=group, config=coordinator_pb2.GroupConfig(conflict_policy="split")
            ),
            timeout=10,
        )
        a = call(
            coordinator.Heartbeat,
            coordinator_pb2.GroupHeartbeatRequest(group=group, subscription={topic: "tagA"}),
            timeout=10,
        )
        request = offset_store_pb2.CommitOffsetsRequest(
            group=group,
            member_id=a.member_id,
            member_epoch=a.member_epoch,
            offsets=[offset_store_pb2.PartitionOffset(topic=topic, partition=0, offset=4, topic_id=topic_id)],
        )
        [result] = call(store.CommitOffsets, request, timeout=10).results
        assert result.error.code == common_pb2.NONE, result
        b = call(
            coordinator.Heartbeat,
            coordinator_pb2.GroupHeartbeatRequest(group=group, subscription={topic: "tagB"}),
            timeout=10,
        )
        [track] = {p.track for p in b.assignment.partitions}
        assert track != "default"
        copied = f"sluice:off:{{{group}}}:{track}"
        assert rds.hget(copied, f"{topic}/0") == b"4"  # the new track starts where the default one is
        assert rds.hget(f"sluice:topic:{{{topic}}}:refs", copied) == b"h"
        client.admin.delete_topic(topic)
        leftovers = sorted(e for e in inventory(rds) if f"{topic}/" in e or f"{{{topic}}}" in e)
        owners = [e for e in leftovers if f":grp:{{{group}}}:owners" in e]
        # Only ownership stays until the group drops the partitions (the group protocol's state).
        assert leftovers == owners, leftovers
        for member in (a, b):
            call(
                coordinator.Heartbeat,
                coordinator_pb2.GroupHeartbeatRequest(
                    group=group, member_id=member.member_id, member_epoch=-1
                ),
                timeout=10,
            )
        eventually(
            lambda: not [e for e in inventory(rds) if f"{topic}/" in e or f"{{{topic}}}" in e],
            what="ownership released",
        )
