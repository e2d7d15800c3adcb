"""One group consumer against real services: positions, commits, filters, flow control, bad input."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from sluice.client.consumer import Consumer
from sluice.codec.batch import Record
from sluice.errors import (
    GroupNotEmpty,
    InvalidArgument,
    InvalidFilter,
    InvalidTopic,
    OffsetOutOfRange,
    UnknownAssignor,
    UnknownTopicOrPartition,
)
from tests.integration.consumer.conftest import Cluster

FAST: dict[str, Any] = {"session_timeout": "5s", "fetch_max_wait": "100ms"}


def produce(cluster: Cluster, topic: str, n: int, tag: str | None = None, start: int = 0) -> None:
    with cluster.client().producer(topic, partitioner="round_robin") as p:
        for i in range(start, start + n):
            p.send(f"v{i}".encode(), tag=tag)
        p.flush()


def poll_until(
    consumer: Consumer, done: Callable[[list[Record]], bool], timeout: float = 10.0
) -> list[Record]:
    got: list[Record] = []
    deadline = time.monotonic() + timeout
    while not done(got):
        assert time.monotonic() < deadline, f"timed out with {len(got)} records"
        got += consumer.poll(0.2)
    return got


def test_poll_commit_and_resume_from_the_committed_offsets(cluster: Cluster) -> None:
    topic = cluster.topic(4)
    produce(cluster, topic, 40)
    client = cluster.client()
    assigned: list[list[tuple[str, int]]] = []
    revoked: list[list[tuple[str, int]]] = []
    c = client.consumer(
        "basics-1",
        [topic],
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        on_assign=assigned.append,
        on_revoke=revoked.append,
        **FAST,
    )
    got = poll_until(c, lambda g: len(g) >= 40)
    assert sorted(int(r.value[1:]) for r in got) == list(range(40))
    assert assigned == [[(topic, p) for p in range(4)]]
    assert c.assignment() == {(topic, p) for p in range(4)}
    assert all(c.position((topic, p)) == 10 for p in range(4))
    # poll mode: an explicit commit() (after processing) covers everything poll() returned.
    assert c.commit() == {(topic, p): 10 for p in range(4)}
    assert c.committed() == {(topic, p): 10 for p in range(4)}
    c.close()
    assert revoked == [[(topic, p) for p in range(4)]]
    assert client.admin.group_offsets("basics-1") == {(topic, p): 10 for p in range(4)}

    produce(cluster, topic, 8, start=40)
    again = client.consumer("basics-1", [topic], auto_offset_reset="earliest", **FAST)
    rest = poll_until(again, lambda g: len(g) >= 8)
    assert sorted(int(r.value[1:]) for r in rest) == list(range(40, 48))
    again.close()


def test_highwater_is_each_partitions_end_as_of_the_last_fetch_answer(cluster: Cluster) -> None:
    topic = cluster.topic(2)
    produce(cluster, topic, 10)
    c = cluster.client().consumer("hw-1", [topic], auto_offset_reset="earliest", **FAST)
    poll_until(c, lambda g: len(g) >= 10)
    tps = [(topic, p) for p in range(2)]
    assert [c.highwater(tp) for tp in tps] == [5, 5]
    produce(cluster, topic, 4, start=10)
    poll_until(c, lambda g: len(g) >= 4)
    # The answers that carried the new records carried the new ends; no request of its own.
    assert sum(c.highwater(tp) or 0 for tp in tps) == 14
    assert all(c.highwater(tp) == c.position(tp) for tp in tps)
    with pytest.raises(InvalidArgument):
        c.highwater((topic, 7))  # not assigned here, as position()
    c.close()


def test_close_commits_exactly_what_was_returned(cluster: Cluster) -> None:
    topic = cluster.topic(1)
    produce(cluster, topic, 30)
    client = cluster.client()
    c = client.consumer("basics-2", {topic: "*"}, auto_offset_reset="earliest", max_poll_records=7, **FAST)
    first = poll_until(c, lambda g: len(g) > 0)
    assert [r.offset for r in first] == list(range(7))
    c.close()
    assert client.admin.group_offsets("basics-2") == {(topic, 0): 7}


def test_seek_pause_resume(cluster: Cluster) -> None:
    topic = cluster.topic(2)
    produce(cluster, topic, 20)
    c = cluster.client().consumer("basics-3", [topic], auto_offset_reset="earliest", **FAST)
    poll_until(c, lambda g: len(g) >= 20)
    c.seek((topic, 0), 3)
    again = poll_until(c, lambda g: len(g) >= 7)
    assert [r.offset for r in again] == list(range(3, 10))
    c.pause([(topic, 1)])
    assert c.paused() == {(topic, 1)}
    produce(cluster, topic, 4, start=20)  # two land on each partition
    got = poll_until(c, lambda g: len(g) >= 2)
    time.sleep(0.3)
    got += c.poll(0.2)
    assert {r.partition for r in got} == {0}
    c.resume([(topic, 1)])
    got = poll_until(c, lambda g: len(g) >= 2)
    assert {(r.partition, r.offset) for r in got} == {(1, 10), (1, 11)}
    with pytest.raises(InvalidArgument, match="not assigned"):
        c.seek((topic, 7), 0)
    with pytest.raises(OffsetOutOfRange):
        c.seek((topic, 0), -1)
    c.close()


def test_auto_offset_reset_latest_and_none(cluster: Cluster) -> None:
    topic = cluster.topic(1)
    produce(cluster, topic, 5)
    client = cluster.client()
    latest = client.consumer("basics-4", [topic], **FAST)  # the default: latest
    assert latest.poll(0.5) == []
    produce(cluster, topic, 1, start=5)
    assert [r.value for r in poll_until(latest, lambda g: len(g) > 0)] == [b"v5"]
    latest.close()

    none = client.consumer("basics-5", [topic], auto_offset_reset="none", **FAST)
    with pytest.raises(OffsetOutOfRange, match="no committed offset"):
        poll_until(none, lambda g: False, timeout=5)
    none.seek((topic, 0), 4)
    assert [r.offset for r in poll_until(none, lambda g: len(g) >= 2)] == [4, 5]
    none.close()


def test_an_empty_filtered_fetch_advances_the_committed_offset(cluster: Cluster) -> None:
    topic = cluster.topic(1)
    produce(cluster, topic, 10, tag="tagB")
    client = cluster.client()
    c = client.consumer(
        "basics-6", {topic: "tagA"}, auto_offset_reset="earliest", auto_commit_interval="100ms", **FAST
    )
    deadline = time.monotonic() + 10
    while client.admin.group_offsets("basics-6").get((topic, 0)) != 10:
        assert time.monotonic() < deadline, "the filtered progress was never committed"
        assert c.poll(0.1) == []
    c.close()


def test_in_flight_min_never_commits_past_an_unfinished_record(cluster: Cluster) -> None:
    topic = cluster.topic(1)
    produce(cluster, topic, 10)
    client = cluster.client()
    c = client.consumer(
        "basics-7", [topic], auto_offset_reset="earliest", commit_mode="in-flight-min", **FAST
    )
    records = poll_until(c, lambda g: len(g) >= 10)
    slow = records[3]
    for r in records:
        if r is not slow:
            c.done(r)
    c.poll(0)  # a poll alone marks nothing done in this mode
    assert c.commit() == {(topic, 0): 3}  # 3 is still being processed: never skip it
    c.done(slow)
    assert c.commit() == {(topic, 0): 10}
    c.close()
    with pytest.raises(InvalidArgument, match="in-flight-min"):
        client.consumer("basics-8", [topic], **FAST).done(slow)


def test_records_are_prefetched_in_the_background_within_the_byte_bound(cluster: Cluster) -> None:
    topic = cluster.topic(1)
    n = 8000  # 8 MB of values
    with cluster.client().producer(topic, batch_size="16KiB") as p:
        for _ in range(n):
            p.send(b"x" * 1000)
    c = cluster.client().consumer(
        "basics-9",
        [topic],
        auto_offset_reset="earliest",
        buffer_max_bytes=64 * 1024,
        partition_max_bytes=32 * 1024,
        max_poll_records=10,
        **FAST,
    )
    poll_until(c, lambda g: len(g) > 0)
    time.sleep(0.5)  # the fetch thread fills the buffer meanwhile, then stops
    buffered = c._prefetch.buffered_bytes
    # The bound, plus what the round that crossed it brought: at most the answer in hand and
    # the pipelined one (each <= partition_max_bytes + one batch).
    assert 0 < buffered <= 64 * 1024 + 2 * (32 + 16 + 2) * 1024
    got = poll_until(c, lambda g: len(g) >= n - 10, timeout=30)
    assert [r.offset for r in got] == list(range(10, n))
    c.close()


def test_bad_input_is_refused_with_typed_errors(cluster: Cluster) -> None:
    topic = cluster.topic(1)
    client = cluster.client()
    with pytest.raises(InvalidFilter):
        client.consumer("bad-1", {topic: "a ||"})
    with pytest.raises(InvalidTopic):
        client.consumer("bad-1", ["no/slash"])
    with pytest.raises(InvalidArgument):
        client.consumer("bad group", [topic])
    with pytest.raises(InvalidArgument, match="unknown consumer setting"):
        client.consumer("bad-1", [topic], auto_ofset_reset="earliest")
    with pytest.raises(UnknownTopicOrPartition, match="does-not-exist"):
        client.consumer("bad-1", ["does-not-exist"], **FAST)
    with pytest.raises(UnknownAssignor):
        client.consumer("bad-1", [topic], assignor="nope", **FAST)


def test_poll_wakes_up_when_records_arrive(cluster: Cluster) -> None:
    topic = cluster.topic(1)
    c = cluster.client().consumer("basics-10", [topic], auto_offset_reset="earliest", fetch_max_wait="5s")
    c.poll(0.5)  # joined, positions known; the fetch now long-polls the broker
    threading.Timer(0.3, lambda: produce(cluster, topic, 1)).start()
    started = time.monotonic()
    got = c.poll(10)
    assert [r.value for r in got] == [b"v0"]
    assert time.monotonic() - started < 3
    c.close()


def test_a_static_member_comes_back_to_its_partitions(cluster: Cluster) -> None:
    topic = cluster.topic(2)
    produce(cluster, topic, 10)
    client = cluster.client()
    first = client.consumer("static", [topic], instance_id="host-1", auto_offset_reset="earliest", **FAST)
    poll_until(first, lambda g: len(g) >= 10)
    member_id = first.member_id
    first.close()  # a temporary leave (epoch -2): the partitions stay reserved for it
    assert client.admin.describe_group("static").members[0].member_id == member_id
    back = client.consumer("static", [topic], instance_id="host-1", auto_offset_reset="earliest", **FAST)
    assert back.member_id == member_id
    produce(cluster, topic, 2, start=10)
    assert sorted(r.value for r in poll_until(back, lambda g: len(g) >= 2)) == [b"v10", b"v11"]
    back.close()


def test_broadcasting_members_each_read_everything_with_offsets_of_their_own(cluster: Cluster) -> None:
    topic = cluster.topic(2)
    produce(cluster, topic, 6)
    client = cluster.client()
    cfg = {"message_model": "broadcasting", "auto_offset_reset": "earliest", **FAST}
    a = client.consumer("bcast", [topic], **cfg)
    b = client.consumer("bcast", [topic], **cfg)
    got_a = poll_until(a, lambda g: len(g) >= 6)
    got_b = poll_until(b, lambda g: len(g) >= 6)
    assert sorted(r.value for r in got_a) == sorted(r.value for r in got_b)
    a.poll(0)
    assert a.commit() == {(topic, 0): 3, (topic, 1): 3}
    assert client.admin.group_offsets("bcast", member_id=a.member_id) == {(topic, 0): 3, (topic, 1): 3}
    assert a.committed() == {(topic, 0): 3, (topic, 1): 3}
    assert b.committed() == {(topic, 0): None, (topic, 1): None}  # b's own offsets: none yet
    a.close()
    b.close()


def test_set_group_offsets_for_a_group_without_live_members(cluster: Cluster) -> None:
    topic = cluster.topic(3)
    produce(cluster, topic, 30)
    admin = cluster.client().admin
    assert admin.set_group_offsets("spark-like", topic, {0: 4, 1: 7, 2: 4}) == {0: 4, 1: 7, 2: 4}
    assert admin.group_offsets("spark-like") == {(topic, 0): 4, (topic, 1): 7, (topic, 2): 4}
    c = cluster.client().consumer("spark-like", [topic], **FAST)
    got = poll_until(c, lambda g: len(g) >= 30 - 15)
    assert min(r.offset for r in got if r.partition == 1) == 7
    with pytest.raises(GroupNotEmpty):
        admin.set_group_offsets("spark-like", topic, {0: 0})
    c.close()
