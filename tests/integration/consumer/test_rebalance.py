"""Rebalances with real members: continuous churn without duplicates, and a zombie that cannot commit."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from sluice import Client
from sluice.client.consumer import Consumer
from sluice.errors import StaleMemberEpoch, UnknownMember
from tests.integration.consumer.conftest import Cluster

Processed = tuple[int, int]  # (partition, offset)


@dataclass
class Member:
    """A consumer polling in a thread of its own, recording every record it processes."""

    name: str
    consumer: Consumer
    processed: list[Processed] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> Member:
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                for r in self.consumer.poll(0.1):
                    self.processed.append((r.partition, r.offset))
            self.consumer.close()  # a clean leave: commit, revoke, LeaveGroup
        except BaseException as exc:
            self.error = exc

    def leave(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(30)
        assert not self.thread.is_alive()
        assert self.error is None, self.error


class Producer(threading.Thread):
    """Writes continuously (round robin over the partitions) until stopped; remembers every offset."""

    def __init__(self, client: Client, topic: str) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.topic = topic
        self.halt = threading.Event()
        self.written: list[Processed] = []

    def run(self) -> None:
        futures = []
        with self.client.producer(self.topic, partitioner="round_robin", linger="5ms") as p:
            i = 0
            while not self.halt.is_set():
                for _ in range(20):
                    futures.append(p.send(b"%d" % i))
                    i += 1
                time.sleep(0.01)  # ~2,000 records/s: a steady trickle, not a benchmark
            p.flush()
        self.written = [(f.result().partition, f.result().offset) for f in futures]


def test_continuous_churn_consumes_everything_exactly_once_with_clean_joins_and_leaves(
    cluster: Cluster,
) -> None:
    topic = cluster.topic(8, "churn")
    group = "churn"
    cfg: dict[str, Any] = {
        "auto_offset_reset": "earliest",
        "session_timeout": "10s",
        "fetch_max_wait": "100ms",
    }
    producer = Producer(cluster.client(), topic)
    producer.start()

    def member(name: str) -> Member:
        return Member(name, cluster.client(client_id=name).consumer(group, [topic], **cfg)).start()

    members = [member("m1")]
    for name in ("m2", "m3"):  # join one by one while records keep coming
        time.sleep(1.0)
        members.append(member(name))
    time.sleep(1.0)
    for m in members[:2]:  # then leave one by one
        m.leave()
        time.sleep(1.0)
    producer.halt.set()
    producer.join(30)
    written = set(producer.written)
    last = members[2]
    deadline = time.monotonic() + 30
    while True:
        seen = set(p for m in members for p in m.processed)
        if written <= seen:
            break
        assert time.monotonic() < deadline, f"{len(written - seen)} records never consumed"
        time.sleep(0.1)
    last.leave()

    counts = Counter(p for m in members for p in m.processed)
    assert set(counts) == written, "every record consumed, and nothing that was not written"
    duplicates = {p: n for p, n in counts.items() if n > 1}
    assert duplicates == {}, f"{len(duplicates)} records processed twice, e.g. {sorted(duplicates)[:5]}"
    assert all(len(m.processed) > 0 for m in members), [len(m.processed) for m in members]
    print("processed per member:", [len(m.processed) for m in members], "records:", len(written))
    # Every member saw each partition's records in order: a rebalance never rewinds a partition.
    for m in members:
        by_partition: dict[int, list[int]] = {}
        for p, off in m.processed:
            by_partition.setdefault(p, []).append(off)
        assert all(offs == sorted(offs) for offs in by_partition.values())
    # Clean leaves committed everything: the group's offsets are at the end of each partition.
    ends = Counter(p for p, _ in written)
    assert cluster.client().admin.group_offsets(group) == {(topic, p): n for p, n in ends.items()}


def test_a_fenced_member_cannot_commit(cluster: Cluster) -> None:
    topic = cluster.topic(4, "zombie")
    group = "zombie"
    with cluster.client().producer(topic, partitioner="round_robin") as p:
        for i in range(40):
            p.send(b"%d" % i)
    lost: list[list[tuple[str, int]]] = []
    revoked: list[tuple[str, int]] = []
    zombie = cluster.client().consumer(
        group,
        [topic],
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        rebalance_timeout="1s",
        session_timeout="10s",
        on_lost=lost.append,
        on_revoke=revoked.extend,
    )
    got: list[object] = []
    while len(got) < 40:
        got += zombie.poll(0.2)
    zombie.poll(0)  # everything returned so far counts as processed
    old_member, old_epoch = zombie.member_id, zombie.member_epoch

    # A second member joins; the zombie's application is stuck (no poll), so it never releases the
    # partitions the new target takes from it and is fenced after its 1 s rebalance timeout.
    other = Member("other", cluster.client().consumer(group, [topic], auto_offset_reset="earliest")).start()
    deadline = time.monotonic() + 15
    while not other.processed:
        assert time.monotonic() < deadline, "the stuck member's partitions never moved"
        time.sleep(0.1)
    with pytest.raises((UnknownMember, StaleMemberEpoch)):
        zombie.commit()
    # The zombie committed nothing: the new owner re-reads its partitions from the start.
    offsets = cluster.client().admin.group_offsets(group)
    assert all(off <= 10 for off in offsets.values()), offsets
    assert sorted({off for _, off in other.processed})[:1] == [0]

    # Its next poll tells it: the partitions are lost (on_lost) and it rejoins as a new member.
    deadline = time.monotonic() + 10
    while not lost:
        assert time.monotonic() < deadline
        zombie.poll(0.1)
    # Every partition it held is either lost now or was revoked by the commit() above, which runs
    # pending revocations first (which of the two depends on when the fence lands); either way its
    # commits were refused, as the offsets checked above show.
    assert lost[0]
    assert sorted(set(lost[0]) | set(revoked)) == [(topic, p) for p in range(4)]
    assert zombie.member_id not in ("", old_member) or zombie.member_epoch != old_epoch
    other.leave()
    zombie.close()
