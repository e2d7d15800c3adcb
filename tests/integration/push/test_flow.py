"""Flow control through the SDK: permits, zero-queue, max_unacked blocking, pause/resume."""

from __future__ import annotations

import asyncio
import threading
import time

from sluice import Client
from sluice.client.push import Message, PushConsumer
from tests.integration.push.conftest import PushCluster
from tests.integration.push.helpers import drain, eventually, nothing_more, produce


def test_permit_bound_is_never_exceeded(client: Client, topic: str) -> None:
    produce(client, topic, 300)
    with client.push_consumer(
        topic, "bound", "shared", initial_position="earliest", receiver_queue_size=10
    ) as pc:
        got = []
        for _ in range(300):
            msg = pc.receive(timeout=10)
            got.append(msg)
            pc.ack(msg)
            st = pc.stats().flow
            assert st.queued + st.outstanding <= 10
        st = pc.stats().flow
        assert st.over_delivered == 0  # nothing ever arrived beyond the permits, counted per batch
        assert st.max_queued <= 10
        assert st.max_outstanding <= 10
        # Refills: the initial 10, then 5 at a time as the application took half.
        assert st.permits_granted >= 300
        assert sorted(int(m.value) for m in got) == list(range(300))


def test_zero_queue_two_consumers_hold_at_most_one_message(
    cluster: PushCluster, client: Client, topic: str
) -> None:
    n = 200
    produce(client, topic, n, key=lambda i: b"k%d" % i)  # spread over the 4 partitions
    consumers = [
        client.push_consumer(
            topic, "zq", "shared", consumer_name=name, initial_position="earliest", receiver_queue_size=0
        )
        for name in ("a", "b")
    ]
    got: dict[str, list[Message]] = {"a": [], "b": []}
    violations: list[str] = []
    done = threading.Event()

    def run(name: str, pc: PushConsumer) -> None:
        while len(got["a"]) + len(got["b"]) < n:
            try:
                msg = pc.receive(timeout=1.0)
            except TimeoutError:
                continue
            st = pc.stats().flow
            if st.queued + st.outstanding > 0 or st.max_queued > 1 or st.max_outstanding > 1:
                violations.append(f"{name}: {st}")
            got[name].append(msg)
            time.sleep(0.002)  # the message is being processed
            pc.ack(msg)

    def watch() -> None:
        # The dispatcher's view: never more than one permit and one unacked message each.
        while not done.is_set():
            for c in cluster.describe(client, topic, "zq").consumers:
                if c.permits > 1 or c.unacked > 1:
                    violations.append(f"dispatcher: {c}")
            time.sleep(0.01)

    threads = [
        threading.Thread(target=run, args=(name, pc)) for name, pc in zip("ab", consumers, strict=True)
    ]
    watcher = threading.Thread(target=watch)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    done.set()
    watcher.join()
    assert not violations, violations[:5]
    values = sorted(int(m.value) for ms in got.values() for m in ms)
    assert values == list(range(n))
    assert got["a"]
    assert got["b"]
    assert {m.partition for ms in got.values() for m in ms} == set(range(4))
    for pc in consumers:
        st = pc.stats().flow
        assert st.max_queued <= 1
        assert st.max_outstanding <= 1
        assert st.over_delivered == 0
        # Exactly one permit per message received, plus at most the one still outstanding.
        assert st.permits_granted - st.delivered in (0, 1)
        pc.close()


def test_zero_queue_listener_and_async_receive(client: Client, topic: str) -> None:
    produce(client, topic, 30)
    seen: list[Message] = []
    all_seen = threading.Event()
    peak = [0]

    def listener(pc: PushConsumer, msg: Message) -> None:
        st = pc.stats().flow
        peak[0] = max(peak[0], st.queued + st.outstanding)
        seen.append(msg)
        pc.ack(msg)
        if len(seen) == 30:
            all_seen.set()

    with client.push_consumer(
        topic, "zl", "shared", initial_position="earliest", receiver_queue_size=0, message_listener=listener
    ) as pc:
        assert all_seen.wait(20)
        assert peak[0] == 0  # while the listener runs, no permit is out
        assert pc.stats().flow.max_queued <= 1
    assert sorted(int(m.value) for m in seen) == list(range(30))

    async def consume() -> list[int]:
        with client.push_consumer(
            topic, "za", "shared", initial_position="earliest", receiver_queue_size=0
        ) as apc:
            out = []
            for _ in range(30):
                msg = await apc.receive_async(timeout=10)
                out.append(int(msg.value))
                apc.ack(msg)
            try:
                await apc.receive_async(timeout=0.2)
            except TimeoutError:
                pass
            else:
                raise AssertionError("a 31st message")
            return out

    assert sorted(asyncio.run(consume())) == list(range(30))


def test_max_unacked_blocks_until_half_is_acked(client: Client, topic: str) -> None:
    produce(client, topic, 100)
    with client.push_consumer(
        topic, "blk", "shared", initial_position="earliest", receiver_queue_size=100, max_unacked=10
    ) as pc:
        held = drain(pc, 10, ack=False)
        assert nothing_more(pc, 0.5)  # blocked at N = 10 unacked
        for msg in held[:4]:
            pc.ack(msg)
        assert nothing_more(pc, 0.5)  # 6 unacked: still above N/2
        pc.ack(held[4])  # 5 = N/2 unacked: unblocked
        more = drain(pc, 5, ack=False)
        assert nothing_more(pc, 0.5)  # and blocked again at 10
        for msg in held[5:] + more:
            pc.ack(msg)
        rest = drain(pc, 85)
        values = sorted(int(m.value) for m in held + more + rest)
        assert values == list(range(100))


def test_pause_stops_permits_and_resume_restores_them(client: Client, topic: str) -> None:
    with client.push_consumer(
        topic, "pz", "shared", initial_position="earliest", receiver_queue_size=10
    ) as pc:
        pc.pause()
        produce(client, topic, 50)
        first = drain(pc, 10)  # what was granted before the pause still arrives
        assert nothing_more(pc, 0.5)
        assert pc.stats().flow.permits_granted == 10
        pc.resume()
        rest = drain(pc, 40)
        assert sorted(int(m.value) for m in first + rest) == list(range(50))
        eventually(lambda: pc.stats().flow.outstanding == 10, what="full credit")
