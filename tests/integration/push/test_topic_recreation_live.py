"""Topic identity, continued: consumers that stay connected while their topic is deleted and re-created,
and the upgrade of positions written before topic refs existed (docs/redis-schema.md)."""

from __future__ import annotations

import contextlib
import tempfile
import time

import pytest
import redis

from sluice import Client
from sluice.errors import UnknownTopicId, UnknownTopicOrPartition
from tests.harness import restart, run_redis, start_service
from tests.integration.push.conftest import PushCluster
from tests.integration.push.helpers import drain, eventually, produce
from tests.integration.push.identity_helpers import (
    FAST,
    consume_as_old_subscription,
    not_loaded,
    own,
    poll_values,
    rds,
)

__all__ = ["own", "rds"]  # the fixtures, imported for pytest


@pytest.mark.parametrize("commit", ["sync", "async"])
def test_a_live_group_consumer_outliving_the_recreation_reads_the_new_topic_from_its_start(
    own: PushCluster, rds: redis.Redis, commit: str
) -> None:
    """A member that keeps its partition across a delete and re-create holds the old topic's position:
    its commit is refused (UnknownTopicId), and it looks its position up again on the new topic, so no
    record of the new topic is skipped (some may come twice: at least once). The same through
    ``commit_async()``: its commits carry the topic_id too, and a refusal restarts the partition."""
    topic, group = f"live-{commit}", f"live-group-{commit}"
    refused: list[BaseException] = []

    def outcome(_offsets: object, error: BaseException | None) -> None:
        if error is not None:
            refused.append(error)

    with Client(own.bootstrap, request_timeout=10) as client:
        client.admin.create_topic(topic, partitions=1)
        produce(client, topic, 3)
        c = client.consumer(group, [topic], auto_offset_reset="earliest", **FAST)
        try:
            assert poll_values(c, 3) == [b"0", b"1", b"2"]
            c.commit()
            client.admin.delete_topic(topic)
            client.admin.create_topic(topic, partitions=1)
            fresh = [b"new-%d" % i for i in range(5)]
            with client.producer(topic, linger="1ms") as p:
                for value in fresh:
                    p.send(value)
                p.flush()
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while got[-5:] != fresh:
                assert time.monotonic() < deadline, f"the new topic's records did not all arrive: {got}"
                # The fetch that ran while no topic had the name says so once (an existing answer).
                with contextlib.suppress(UnknownTopicOrPartition):
                    got += [r.value or b"" for r in c.poll(0.2)]
                if commit == "async":
                    c.commit_async(callback=outcome)  # outcomes arrive in a later poll()
                    continue
                with contextlib.suppress(UnknownTopicId):
                    c.commit()  # refused while the position is the old topic's; then it starts over
            assert set(fresh) <= set(got)
            if commit == "async":
                assert all(isinstance(e, (UnknownTopicId, UnknownTopicOrPartition)) for e in refused), refused
            c.commit()
            assert rds.hget(f"sluice:off:{{{group}}}:default", f"{topic}/0") == b"5"
        finally:
            c.close()
        client.admin.delete_topic(topic)


def test_an_async_commit_refused_by_topic_id_restarts_the_partition_on_the_new_topic(
    own: PushCluster, rds: redis.Redis
) -> None:
    """``commit_async()`` carries the topic_id like ``commit()``: the old topic's position is refused with
    UnknownTopicId (reported to the callback), and the partition looks its position up again, so the new
    topic is read from its first record. The partition is paused across the re-creation so that no fetch
    notices the vanished topic: only the refused async commit can tell the consumer."""
    topic, group = "live-async", "live-async-group"
    tp = (topic, 0)
    outcomes: list[BaseException | None] = []
    with Client(own.bootstrap, request_timeout=10) as client:
        client.admin.create_topic(topic, partitions=1)
        produce(client, topic, 3)
        c = client.consumer(group, [topic], auto_offset_reset="earliest", **FAST)
        try:
            assert poll_values(c, 3) == [b"0", b"1", b"2"]
            c.commit()
            c.pause([tp])
            c.poll(0.3)  # a fetch already on the wire lands (and is dropped) before the delete
            client.admin.delete_topic(topic)
            client.admin.create_topic(topic, partitions=1)
            fresh = [b"new-%d" % i for i in range(5)]
            with client.producer(topic, linger="1ms") as p:
                for value in fresh:
                    p.send(value)
                p.flush()
            c.commit_async({tp: 3}, callback=lambda _offsets, error: outcomes.append(error))
            got: list[bytes] = []
            deadline = time.monotonic() + 10
            while not outcomes:
                assert time.monotonic() < deadline, "the async commit's outcome never arrived"
                # Outcomes are delivered on the application thread, in poll(). (If the group's tick saw
                # the topic gone and revoked the partition meanwhile, it comes back unpaused and may
                # be read from here already.)
                got += [r.value or b"" for r in c.poll(0.1)]
            [error] = outcomes
            assert isinstance(error, UnknownTopicId), error
            c.resume([tp])
            got += poll_values(c, 5 - len(got))
            assert got == fresh  # from the new topic's first record, none skipped
            c.commit()
            assert rds.hget(f"sluice:off:{{{group}}}:default", f"{topic}/0") == b"5"
        finally:
            c.close()
        client.admin.delete_topic(topic)


def test_positions_written_before_topic_refs_are_adopted_once_when_the_coordinator_starts() -> None:
    """An upgrade: offsets and cursors an older offset store wrote are in no refs hash. The coordinator
    registers them once, purging those of topics deleted long ago, so every later delete finds them."""
    common = ("--port", "0", "--metrics-port", "0")
    with run_redis() as rs, tempfile.TemporaryDirectory() as data:
        coordinator = start_service("coordinator", *common, "--redis-url", rs.url)
        broker = start_service(
            "broker", *common, "--data-dir", data, "--broker-id", "1", "--coordinator", coordinator.address
        )
        r = redis.Redis.from_url(rs.url)
        try:
            with Client(coordinator.address, request_timeout=10) as client:
                client.admin.create_topic("kept", partitions=1)
            assert r.get("sluice:coordinator:refs-adopted") == b"1"  # a fresh Redis has nothing to adopt
            r.delete("sluice:coordinator:refs-adopted")  # ... this one is as an older release left it:
            r.hset("sluice:off:{g}:default", mapping={"ghost/0": 7, "kept/0": 3})
            r.hset("sluice:off:{b}:default:m:m1", mapping={"ghost/0": 1})
            r.sadd("sluice:off:{b}:default:members", "m1")
            r.set("sluice:cur:{s}:ghost/0", b"cursor")
            r.set("sluice:cur:{s}:ghost/0:epoch", 1)
            r.set("sluice:cur:{s}:kept/0", b"cursor")
            r.hset("sluice:subs", mapping={"ghost/s": "1|1|1|*", "kept/s": "1|1|1|*"})
            coordinator.terminate()
            coordinator = restart(coordinator)
            assert r.hgetall("sluice:off:{g}:default") == {b"kept/0": b"3"}
            gone = ("sluice:off:{b}:default:m:m1", "sluice:off:{b}:default:members", "sluice:cur:{s}:ghost/0")
            assert r.exists(*gone, "sluice:cur:{s}:ghost/0:epoch", "sluice:topic:{ghost}:refs") == 0
            assert r.hgetall("sluice:topic:{kept}:refs") == {
                b"sluice:off:{g}:default": b"h",
                b"sluice:cur:{s}:kept/0": b"k",
                b"sluice:subs": b"h",
            }
            assert r.hkeys("sluice:subs") == [b"kept/s"]
            assert r.get("sluice:coordinator:refs-adopted") == b"1"
            with Client(coordinator.address, request_timeout=10) as client:
                client.admin.delete_topic("kept")
            assert r.hgetall("sluice:off:{g}:default") == {}
            assert r.exists("sluice:cur:{s}:kept/0", "sluice:topic:{kept}:refs", "sluice:subs") == 0
        finally:
            r.close()
            broker.terminate()
            coordinator.terminate()


def test_a_live_push_consumer_outliving_the_recreation_never_skips_the_new_topics_start(
    own: PushCluster, rds: redis.Redis
) -> None:
    """The dispatcher unloads a subscription whose topic changed identity (its cursor saves are refused
    anyway). Depending on when it notices, the consumer either fails with the typed error naming the
    re-creation (and the subscription subscribed again starts at the new topic's first record), or its
    reconnect already lands on the new topic and reads it from the first record. Never does it read on
    from the old position alone."""
    topic, sub = "live-push", "live-sub"
    with Client(own.bootstrap, request_timeout=10) as client:
        client.admin.create_topic(topic, partitions=1)
        produce(client, topic, 3)
        pc = client.push_consumer(topic, sub, "exclusive", initial_position="earliest")
        got: list[bytes] = []
        error: UnknownTopicOrPartition | None = None
        try:
            assert [m.value for m in drain(pc, 3)] == [b"0", b"1", b"2"]
            eventually(lambda: rds.exists(f"sluice:cur:{{{sub}}}:{topic}/0") == 1, what="cursor saved")
            client.admin.delete_topic(topic)
            client.admin.create_topic(topic, partitions=1)
            fresh = [b"new-%d" % i for i in range(5)]
            with client.producer(topic, linger="1ms") as p:
                for value in fresh:
                    p.send(value)
                p.flush()
            deadline = time.monotonic() + 20
            while got[-5:] != fresh:
                assert time.monotonic() < deadline, f"neither an error nor the new topic's records: {got}"
                try:
                    msg = pc.receive(timeout=1.0)
                except TimeoutError:
                    continue
                except UnknownTopicOrPartition as exc:
                    error = exc
                    break
                got.append(msg.value or b"")
                pc.ack(msg)
        finally:
            pc.close()
        if error is not None:
            assert "re-created" in str(error)
            assert consume_as_old_subscription(client, topic, sub, 5) == fresh
        client.admin.delete_topic(topic)
        eventually(lambda: not_loaded(own, client, topic, sub), timeout=15, what="subscription unloaded")


def test_a_subscriber_arriving_right_after_a_recreation_reads_the_new_topic(own: PushCluster) -> None:
    """The dispatcher's cached metadata (refreshed every 2 s) may still name the deleted incarnation when a
    consumer subscribes right after a re-creation. A new subscriber means the topic as it is now: it reads
    the new topic and stays subscribed past the next metadata refresh (bound to the stale topic_id, that
    refresh ended its subscription as "deleted, or deleted and re-created")."""
    topic, sub = "resubscribed", "sub"
    with Client(own.bootstrap, request_timeout=10) as client:
        client.admin.create_topic(topic, partitions=1)
        produce(client, topic, 2)
        assert consume_as_old_subscription(client, topic, sub, 2) == [b"0", b"1"]
        client.admin.delete_topic(topic)
        client.admin.create_topic(topic, partitions=1)
        produce(client, topic, 3)
        pc = client.push_consumer(topic, sub, "exclusive", initial_position="earliest")
        try:
            assert [m.value for m in drain(pc, 3)] == [b"0", b"1", b"2"]
            time.sleep(3)  # past the dispatcher's next metadata refresh
            produce(client, topic, 1)
            assert [m.value for m in drain(pc, 1)] == [b"0"]
        finally:
            pc.close()
