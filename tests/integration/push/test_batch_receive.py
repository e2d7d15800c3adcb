"""Batch receive and ack (``receive_many`` / ``ack_many``) against real processes: every message
delivered and acked exactly once, nothing redelivered without a nack or an ack timeout, the iterator's
give-back, and the asyncio wrapper."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

from sluice import Client, aio
from sluice.client.push import Message, PushConsumer
from tests.integration.push.conftest import PushCluster
from tests.integration.push.helpers import eventually, produce


def _drain_many(pc: PushConsumer, n: int, timeout: float = 30.0, batch: int = 64) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"only {len(got)} of {n} messages arrived"
        msgs = pc.receive_many(batch, timeout=1.0)
        assert len(msgs) <= batch
        got += msgs
        pc.ack_many(msgs)
    return got


def test_two_shared_consumers_batch_everything_exactly_once(
    cluster: PushCluster, client: Client, topic: str
) -> None:
    n = 3000
    produce(client, topic, n, key=lambda i: b"k%d" % i)  # spread over the 4 partitions
    consumers = [
        client.push_consumer(topic, "count", "shared", consumer_name=c, initial_position="earliest")
        for c in ("a", "b")
    ]
    seen: Counter[bytes] = Counter()
    redelivered: list[Message] = []
    lock = threading.Lock()

    def run(pc: PushConsumer) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if sum(seen.values()) >= n:
                    return
            msgs = pc.receive_many(100, timeout=0.5)
            with lock:
                seen.update(m.value for m in msgs)
                redelivered.extend(m for m in msgs if m.redelivery_count)
            pc.ack_many(msgs)
            pc.ack_many(msgs)  # idempotent: nothing counted or sent twice

    threads = [threading.Thread(target=run, args=(pc,)) for pc in consumers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    try:
        assert sorted(int(v) for v in seen) == list(range(n)), "every message delivered"
        assert max(seen.values()) == 1, "none twice"
        assert not redelivered
        assert all(pc.receive_many(100, timeout=0.5) == [] for pc in consumers), "nothing more"
        stats = [pc.stats() for pc in consumers]
        assert sum(s.acked for s in stats) == n, "each acked once"
        assert all(s.unacked == 0 and s.flow.over_delivered == 0 for s in stats)
        # The dispatcher's view: everything acked, no redelivery pending.
        eventually(
            lambda: (
                all(c.unacked == 0 for c in cluster.describe(client, topic, "count").consumers)
                and cluster.describe(client, topic, "count").summary.backlog == 0
            ),
            what="the dispatcher to see every ack",
        )
    finally:
        for pc in consumers:
            pc.close()


def test_receive_many_times_out_empty_and_takes_at_most_max(client: Client, topic: str) -> None:
    with client.push_consumer(topic, "max", "shared", initial_position="earliest") as pc:
        start = time.monotonic()
        assert pc.receive_many(10, timeout=0.3) == []
        assert 0.25 <= time.monotonic() - start < 5
        produce(client, topic, 50)
        eventually(lambda: pc.stats().flow.queued >= 7, what="messages queued")
        first = pc.receive_many(7, timeout=5)
        assert len(first) == 7
        rest = _drain_many(pc, 43)
        pc.ack_many(first)
        assert sorted(int(m.value) for m in first + rest) == list(range(50))
        assert pc.stats().acked == 50


def test_nacked_and_unacked_messages_of_a_batch_come_back(client: Client, topic: str) -> None:
    produce(client, topic, 40)
    with client.push_consumer(
        topic, "nack", "shared", initial_position="earliest", nack_delay="100ms", ack_timeout="1s"
    ) as pc:
        got: list[Message] = []
        deadline = time.monotonic() + 20
        while len(got) < 40 and time.monotonic() < deadline:
            got += pc.receive_many(40, timeout=1.0)
        assert len(got) == 40
        nacked = [m for m in got if int(m.value) % 10 == 0]
        silent = [m for m in got if int(m.value) % 10 == 5]  # neither acked nor nacked: ack timeout
        for m in nacked:
            pc.nack(m)
        pc.ack_many(m for m in got if m not in nacked and m not in silent)
        back: list[Message] = []
        deadline = time.monotonic() + 20
        while len(back) < 8 and time.monotonic() < deadline:
            msgs = pc.receive_many(10, timeout=0.5)
            back += msgs
            pc.ack_many(msgs)
        assert sorted(int(m.value) for m in back) == sorted(int(m.value) for m in nacked + silent)
        assert all(m.redelivery_count == 1 for m in back)
        assert pc.receive_many(10, timeout=1.5) == [], "nothing else comes back"


def test_leaving_an_iterator_gives_back_what_it_had_not_yielded(client: Client, topic: str) -> None:
    produce(client, topic, 30)
    with client.push_consumer(topic, "iter", "exclusive", initial_position="earliest") as pc:
        eventually(lambda: pc.stats().flow.queued == 30, what="30 messages queued")
        first: list[Message] = []
        for msg in pc:
            first.append(msg)
            pc.ack(msg)
            if len(first) == 3:
                break
        assert pc.stats().unacked == 0, "the 27 not yielded are not the application's"
        rest = _drain_many(pc, 27)
        assert sorted(int(m.value) for m in first + rest) == list(range(30))
        assert all(m.redelivery_count == 0 for m in rest), "given back, not redelivered"
        assert pc.stats().flow.over_delivered == 0
        assert pc.receive_many(10, timeout=0.5) == []


def test_listener_gets_every_message_once(client: Client, topic: str) -> None:
    n = 500
    produce(client, topic, n)
    seen: Counter[bytes] = Counter()
    done = threading.Event()

    def listener(pc: object, msg: Message) -> None:
        seen[msg.value] += 1
        pc.ack(msg)  # type: ignore[attr-defined]
        if sum(seen.values()) >= n:
            done.set()

    with client.push_consumer(
        topic, "listen", "shared", initial_position="earliest", message_listener=listener
    ) as pc:
        assert done.wait(30)
        time.sleep(0.3)
        assert pc.stats().acked == n
    assert sorted(int(v) for v in seen) == list(range(n))
    assert max(seen.values()) == 1


def test_aio_receive_many_and_ack_many(cluster: PushCluster, topic: str) -> None:
    n = 300
    with Client(cluster.bootstrap, request_timeout=10) as c:
        produce(c, topic, n)

    async def main() -> list[bytes]:
        async with (
            aio.Client(cluster.bootstrap, request_timeout=10) as client,
            client.push_consumer(topic, "aio", "shared", initial_position="earliest") as pc,
        ):
            got: list[Message] = []
            deadline = time.monotonic() + 20
            while len(got) < n and time.monotonic() < deadline:
                msgs = await pc.receive_many(64, timeout=1.0)
                assert len(msgs) <= 64
                pc.ack_many(msgs)
                got += msgs
            assert await pc.receive_many(64, timeout=0.3) == []
            assert pc.stats().acked == n
            return [m.value for m in got]

    values = asyncio.run(main())
    assert sorted(int(v) for v in values) == list(range(n))
