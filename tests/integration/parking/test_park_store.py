"""Key_Shared parking with its durable store, ``<topic>.<subscription>.PARK`` (docs/poison-keys.md, "Where
parked messages live"), against real processes: coordinator, broker, offset store and dispatcher, the
dispatcher killed with SIGKILL.

- The cursor's persisted mark-delete passes the parked messages (the log's retention could delete them).
- After a ``kill -9`` the parked keys are listed at once, before any consumer came back (from the store),
  and the key's order holds: its parked messages, then its later ones.
- Killed repeatedly while parking and dead-lettering: every message is counted. None lost, none parked
  twice (each source once in the store), per-key order kept, the poison key's messages in the DLQ in order.
"""

from __future__ import annotations

import random
import signal
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from sluice import Client
from sluice.client.push import Message, PushConsumer
from sluice.codec.batch import Record
from sluice.retry.parkbook import H_OP, H_PSOURCE, ParkBook
from sluice.v1 import offset_store_pb2, offset_store_pb2_grpc
from tests.integration.push.conftest import PushCluster, run_push_cluster

POISON = b"poison"


@pytest.fixture(scope="module")
def cluster() -> Iterator[PushCluster]:
    with run_push_cluster() as c:
        yield c


def persisted_mark_delete(cluster: PushCluster, topic: str, sub: str, partition: int = 0) -> int:
    with grpc.insecure_channel(cluster.offset_store.address) as ch:
        stub = offset_store_pb2_grpc.OffsetStoreStub(ch)
        resp = stub.LoadCursor(
            offset_store_pb2.LoadCursorRequest(topic=topic, partition=partition, subscription=sub), timeout=5
        )
    return resp.cursor.mark_delete if resp.found else -1


def read_all(client: Client, topic: str, timeout: float = 30) -> list[Message]:
    """Every record of partition 0 of ``topic``, in log order (an exclusive push subscription)."""
    end = client.list_offsets(topic, "latest")[0]
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    sub = f"read-{uuid.uuid4().hex[:6]}"
    with client.push_consumer(topic, sub, "exclusive", initial_position="earliest") as pc:
        while len(out) < end:
            assert time.monotonic() < deadline, f"read {len(out)} of {end} records of {topic}"
            try:
                m = pc.receive(timeout=1.0)
            except TimeoutError:
                continue
            out.append(m)
            pc.ack(m)
    return out


def replayed(events: list[Message]) -> ParkBook:
    book = ParkBook()
    for e in events:
        book.apply(Record(e.topic, e.partition, e.offset, e.key, e.value, e.tag, e.headers, e.timestamp))
    return book


def wait_for(what: str, check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_mark_delete_passes_parked_messages_and_a_kill_9_keeps_the_parking(cluster: PushCluster) -> None:
    topic = f"pstore-{uuid.uuid4().hex[:6]}"
    settings: dict[str, Any] = {"nack_delay": "50ms", "max_redeliver": 1, "park_after": 1, "park_hold": True}
    with Client(cluster.bootstrap, request_timeout=10) as client:
        client.admin.create_topic(topic, partitions=1)
        with client.producer(topic, linger="1ms") as producer:
            for i in range(20):
                producer.send(str(i).encode(), key=POISON if i % 2 == 0 else f"ok{i % 3}".encode())
            producer.flush()
        good: list[int] = []
        with client.push_consumer(
            topic, "s", "key_shared", consumer_id="c1", initial_position="earliest", **settings
        ) as pc:
            deadline = time.monotonic() + 30
            while True:
                assert time.monotonic() < deadline, "the key was never held with all of its records"
                try:
                    m = pc.receive(timeout=0.1)
                    (pc.nack if m.key == POISON else pc.ack)(m)
                    if m.key != POISON:
                        good.append(int(m.value))
                except TimeoutError:
                    pass
                keys = client.admin.list_parked_keys(topic, "s")
                if keys and keys[0].state == "held" and keys[0].waiting == 9 and len(good) == 10:
                    break
            # Every record is acknowledged on the persisted cursor: the good ones by the consumer, the
            # ten parked ones once the store held them (before: the mark-delete stayed at offset 0).
            wait_for(
                "the mark-delete past the parked records",
                lambda: persisted_mark_delete(cluster, topic, "s") == 20,
            )
            # Now the cursor can no longer be saved (the offset store is paused): two more records of the
            # key park (stored, acknowledged on the cursor only in the dying dispatcher's memory), and two
            # good ones are acknowledged. Then kill -9: the window between the park write and the
            # cursor's acknowledgement reaching the offset store.
            store = cluster.offset_store.process
            store.send_signal(signal.SIGSTOP)
            try:
                with client.producer(topic, linger="1ms") as producer:
                    for i in range(20, 24):
                        producer.send(str(i).encode(), key=POISON if i % 2 == 0 else b"ok-late")
                    producer.flush()
                late: list[int] = []
                while len(late) < 2:
                    m = pc.receive(timeout=10)
                    assert m.key != POISON, "a record of the held key was delivered"
                    late.append(int(m.value))
                    pc.ack(m)
                assert late == [21, 23]
                wait_for(
                    "the later records parked",
                    lambda: (
                        [(k.state, k.waiting) for k in client.admin.list_parked_keys(topic, "s")]
                        == [("held", 11)]
                    ),
                )
            except BaseException:
                store.send_signal(signal.SIGCONT)
                raise
        cluster.dispatcher.kill()
        store.send_signal(signal.SIGCONT)
        assert persisted_mark_delete(cluster, topic, "s") == 20
        cluster.restart_dispatcher(kill=True)
        # Listed at once, from the store: no consumer is back yet, the subscription is not loaded. (A
        # clean-clone run once listed nothing here: the dispatcher's view of the routing was still the
        # empty one it starts with; the listing now takes its partitions after reading the store.)
        keys = client.admin.list_parked_keys(topic, "s")
        assert [(k.key, k.state, k.head_offset, k.waiting) for k in keys] == [(POISON, "stored", 0, 11)]
        with client.push_consumer(
            topic, "s", "key_shared", consumer_id="c2", initial_position="earliest", **settings
        ) as pc:
            # 21 and 23 again (their acknowledgements never reached the offset store: at least once);
            # 20 and 22, parked before the kill, are neither delivered nor parked again.
            again = [pc.receive(timeout=10) for _ in range(2)]
            assert sorted(int(m.value) for m in again) == [21, 23]
            for m in again:
                pc.ack(m)
            wait_for(
                "the key held again",
                lambda: (
                    [(k.state, k.waiting) for k in client.admin.list_parked_keys(topic, "s")]
                    == [("held", 11)]
                ),
            )
            with pytest.raises(TimeoutError):
                pc.receive(timeout=0.5)  # held: nothing of the key is delivered
            # The key is still held, and the persisted mark-delete is past all of its parked records
            # (the restart acknowledged the log's copies of 20 and 22 from the store's replay).
            wait_for("the mark-delete past them", lambda: persisted_mark_delete(cluster, topic, "s") == 24)
            assert client.admin.unpark_key(topic, "s", POISON) == 12
            got = [pc.receive(timeout=10) for _ in range(12)]
            assert [int(m.value) for m in got] == list(range(0, 24, 2))  # parked, then later ones, in order
            assert [m.redelivery_count for m in got] == [0] * 12
            for m in got:
                pc.ack(m)
            wait_for("the key released", lambda: not client.admin.list_parked_keys(topic, "s"))
            # Everything is acknowledged on the persisted cursor (the log's copies of 20 and 22 too).
            wait_for("the mark-delete at the end", lambda: persisted_mark_delete(cluster, topic, "s") == 24)
        assert not any(t.name == f"{topic}.s.DLQ" for t in client.admin.list_topics())
        # The store holds the twelve parks, each once, and (once written) their resolution: its replay
        # parks nothing any more.
        events = wait_for(
            "the store resolved",
            lambda: (ev := read_all(client, f"{topic}.s.PARK")) and not replayed(ev).keys and ev,
        )
        parks = [e.headers[H_PSOURCE] for e in events if e.headers.get(H_OP) == b"park"]
        assert len(parks) == len(set(parks)) == 12


def test_kill_9_while_parking_loses_nothing_and_parks_nothing_twice(cluster: PushCluster) -> None:
    """A poison key (15 % of 3,000 records on 2 partitions, 200 good keys) always fails; DLQ policy,
    ``max_redeliver`` 2, a cap of 30 (so the key cycles through park, cap, DLQ, probe). The dispatcher
    is killed with SIGKILL four times at random moments while the consumer works; its SDK consumer
    reconnects. Counted: every good record acknowledged (duplicates only from the kills: at least
    once), each key's records first delivered in order; every poison record in the DLQ, in order
    (duplicates from a kill between a DLQ write and its ``resolved`` event: at least once); every
    source parked once in the store."""
    rng = random.Random(17)
    topic = f"pchaos-{uuid.uuid4().hex[:6]}"
    n = 3000
    with Client(cluster.bootstrap, request_timeout=10) as client:
        client.admin.create_topic(topic, partitions=2)
        keys = [POISON if rng.random() < 0.15 else f"k{rng.randrange(200)}".encode() for _ in range(n)]
        with client.producer(topic, linger="5ms") as producer:
            for i, k in enumerate(keys):
                producer.send(str(i).encode(), key=k)
            producer.flush()
        poison = [i for i, k in enumerate(keys) if k == POISON]
        good = {i for i, k in enumerate(keys) if k != POISON}
        seen: Counter[int] = Counter()
        order: dict[bytes, list[int]] = defaultdict(list)
        lock = threading.Lock()
        stop = threading.Event()
        pc: PushConsumer = client.push_consumer(
            topic,
            "s",
            "key_shared",
            initial_position="earliest",
            receiver_queue_size=50,
            nack_delay="20ms",
            max_redeliver=2,
            park_after=1,
            park_max_messages=30,
        )

        def consume() -> None:
            while not stop.is_set():
                try:
                    m = pc.receive(timeout=0.1)
                except TimeoutError:
                    continue
                if m.key == POISON:
                    pc.nack(m)
                    continue
                v = int(m.value)
                with lock:
                    if not seen[v]:
                        assert m.key is not None
                        order[m.key].append(v)
                    seen[v] += 1
                pc.ack(m)
                time.sleep(0.0005)  # a consumer that works: the kills land mid-run

        t = threading.Thread(target=consume, daemon=True)
        t.start()
        try:
            for share in (0.15, 0.35, 0.6, 0.85):
                wait_for(f"{share:.0%} of the good records", lambda s=share: len(seen) >= s * len(good), 120)
                time.sleep(rng.uniform(0.0, 0.2))
                cluster.restart_dispatcher(kill=True)
            wait_for("every good record", lambda: set(seen) == good, 120)
            dlq = wait_for(
                "every poison record in the DLQ",
                lambda: (got := _values(client, f"{topic}.s.DLQ")) and set(got) >= set(poison) and got,
                120,
            )
        finally:
            stop.set()
            t.join(10)
            pc.close()
        firsts = list(dict.fromkeys(dlq))
        assert firsts == poison, "poison records missing from the DLQ or out of order"
        for k, vs in order.items():
            assert vs == sorted(vs), f"key {k!r} out of order"
        parks = [
            e.headers[H_PSOURCE]
            for e in read_all(client, f"{topic}.s.PARK")
            if e.headers.get(H_OP) == b"park"
        ]
        assert len(parks) == len(set(parks)), "a message was parked twice"
        dups = sum(c - 1 for c in seen.values())
        print(
            f"good {len(good)} (duplicates {dups}), poison {len(poison)} (DLQ {len(dlq)}, duplicates "
            f"{len(dlq) - len(firsts)}), parked {len(parks)}",
            file=sys.stderr,
        )


def _values(client: Client, topic: str) -> list[int]:
    if not any(t.name == topic for t in client.admin.list_topics()):
        return []
    return [int(m.value) for m in read_all(client, topic)]
