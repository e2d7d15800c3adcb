"""Subscription types through the SDK, against a real dispatcher."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from sluice import Client
from sluice.client.push import Message, PushConsumer
from sluice.errors import ConsumerBusy, InvalidArgument, SubscriptionTypeMismatch, UnknownTopicOrPartition
from tests.integration.push.helpers import drain, eventually, nothing_more, produce


def test_exclusive_second_consumer_is_busy(client: Client, topic: str) -> None:
    with client.push_consumer(topic, "ex", "exclusive", initial_position="earliest") as first:
        with pytest.raises(ConsumerBusy):
            client.push_consumer(topic, "ex", "exclusive")
        produce(client, topic, 20)
        got = drain(first, 20)
        assert sorted(int(m.value) for m in got) == list(range(20))
        assert nothing_more(first, 0.2)
        assert first.active_partitions == frozenset(range(4))
    # The first one left: the subscription is free again.
    with client.push_consumer(topic, "ex", "exclusive") as again:
        assert again.stats().streams[0].state == "subscribed"


def test_type_mismatch_and_unknown_topic(client: Client, topic: str) -> None:
    with client.push_consumer(topic, "mix", "shared"), pytest.raises(SubscriptionTypeMismatch):
        client.push_consumer(topic, "mix", "failover")
    with pytest.raises(UnknownTopicOrPartition):
        client.push_consumer("no-such-topic", "s", "shared")
    with pytest.raises(InvalidArgument):
        client.push_consumer(topic, "s", "round_robin")
    with pytest.raises(InvalidArgument):
        client.push_consumer(topic, "s", "shared", receiver_queue_size=-1)


def test_shared_spreads_across_two_consumers(client: Client, topic: str) -> None:
    a = client.push_consumer(topic, "sh", "shared", initial_position="earliest", receiver_queue_size=10)
    b = client.push_consumer(topic, "sh", "shared", initial_position="earliest", receiver_queue_size=10)
    produce(client, topic, 200)
    got: dict[str, list[Message]] = {"a": [], "b": []}

    def run(name: str, pc: PushConsumer) -> None:
        while True:
            try:
                msg = pc.receive(timeout=1.0)
            except TimeoutError:
                return
            got[name].append(msg)
            pc.ack(msg)
            time.sleep(0.001)  # a working consumer: the other one gets its turn

    threads = [threading.Thread(target=run, args=item) for item in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a.close()
    b.close()
    values = sorted(int(m.value) for ms in got.values() for m in ms)
    assert values == list(range(200))  # everything, once
    assert min(len(got["a"]), len(got["b"])) > 20, {k: len(v) for k, v in got.items()}


def test_failover_spreads_partitions_and_standby_takes_over(client: Client, topic: str) -> None:
    a = client.push_consumer(topic, "fo", "failover", consumer_name="a", initial_position="earliest")
    b = client.push_consumer(topic, "fo", "failover", consumer_name="b", initial_position="earliest")

    def spread() -> bool:
        pa, pb = a.active_partitions, b.active_partitions
        return bool(pa and pb and not pa & pb and pa | pb == frozenset(range(4)))

    eventually(spread, what="the partitions spread over both consumers")
    produce(client, topic, 40)
    # Each consumer receives exactly the messages of the partitions it is active for.
    received: list[Message] = []
    for pc in (a, b):
        while True:
            try:
                msg = pc.receive(timeout=0.5)
            except TimeoutError:
                break
            assert msg.partition in pc.active_partitions
            received.append(msg)
            pc.ack(msg)
    assert sorted(int(m.value) for m in received) == list(range(40))
    # The active consumer of some partitions leaves: the standby takes them over.
    a.close()
    eventually(lambda: b.active_partitions == frozenset(range(4)), what="takeover")
    produce(client, topic, 20)
    got = drain(b, 20)
    assert {m.partition for m in got} <= set(range(4))
    assert sorted(int(m.value) for m in got) == list(range(20))
    b.close()


def test_key_shared_keeps_per_key_order_while_consumers_join_and_leave(client: Client, topic: str) -> None:
    keys = [f"k{i}".encode() for i in range(16)]
    n = 1200
    log: list[tuple[bytes, int, str]] = []  # (key, sequence, consumer) in the order received
    lock = threading.Lock()
    stop = threading.Event()

    def consume(name: str, pc: PushConsumer, until: threading.Event) -> None:
        while not until.is_set():
            try:
                msg = pc.receive(timeout=0.2)
            except TimeoutError:
                continue
            with lock:  # recorded before the ack: the next of this key cannot be out yet
                log.append((msg.key or b"", int(msg.value), name))
            time.sleep(0.0005)
            pc.ack(msg)

    def make(name: str) -> tuple[PushConsumer, threading.Event, threading.Thread]:
        pc = client.push_consumer(
            topic, "ks", "key_shared", consumer_name=name, initial_position="earliest", receiver_queue_size=20
        )
        until = threading.Event()
        t = threading.Thread(target=consume, args=(name, pc, until))
        t.start()
        return pc, until, t

    producer_done = threading.Event()

    def produce_slowly() -> None:
        with client.producer(topic, linger="1ms") as producer:
            for i in range(n):
                producer.send(str(i).encode(), key=keys[i % len(keys)])
                if i % 100 == 99:
                    producer.flush()
                    time.sleep(0.05)
        producer_done.set()

    first = make("a")
    feeder = threading.Thread(target=produce_slowly)
    feeder.start()
    time.sleep(0.2)
    second = make("b")  # joins while keys are in flight
    time.sleep(0.3)
    first[1].set()  # a leaves (what it holds unacked goes back to the subscription)
    first[2].join()
    first[0].close()
    third = make("c")  # joins after a left
    feeder.join()
    eventually(lambda: len({(k, s) for k, s, _ in log}) >= n, timeout=30, what="all messages")
    for pc, until, t in (second, third):
        until.set()
        t.join()
        pc.close()
    stop.set()
    per_key: dict[bytes, list[int]] = defaultdict(list)
    seen: set[int] = set()
    for key, seq, _ in log:
        if seq in seen:
            continue  # a redelivery of something the leaving consumer held
        seen.add(seq)
        per_key[key].append(seq)
    assert seen == set(range(n))
    for key, seqs in per_key.items():
        assert seqs == sorted(seqs), f"key {key!r} out of order"
    assert {name for _, _, name in log} == {"a", "b", "c"}
