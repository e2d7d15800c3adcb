"""Nack, ack timeout, redelivery counts and the dead-letter topic, through the SDK."""

from __future__ import annotations

import time

from sluice import Client
from sluice.client.push import dlq_topic
from tests.integration.push.helpers import drain, nothing_more, produce


def test_nack_redelivers_with_increasing_count(client: Client, topic: str) -> None:
    produce(client, topic, 1)
    with client.push_consumer(topic, "nk", "shared", initial_position="earliest", nack_delay="100ms") as pc:
        counts = []
        for _ in range(3):
            msg = pc.receive(timeout=10)
            counts.append(msg.redelivery_count)
            pc.nack(msg)
        msg = pc.receive(timeout=10)
        counts.append(msg.redelivery_count)
        pc.ack(msg)
        assert counts == [0, 1, 2, 3]
        assert msg.value == b"0"
        assert nothing_more(pc, 0.4)
        assert pc.stats().nacked == 3
        assert pc.stats().acked == 1


def test_nack_backoff_is_exponential(client: Client, topic: str) -> None:
    produce(client, topic, 1)
    with client.push_consumer(
        topic, "nb", "shared", initial_position="earliest", nack_delay="100ms", nack_backoff=True
    ) as pc:
        msg = pc.receive(timeout=10)
        gaps = []
        for _ in range(3):
            t0 = time.monotonic()
            pc.nack(msg)
            msg = pc.receive(timeout=10)
            gaps.append(time.monotonic() - t0)
        pc.ack(msg)
    # 100 ms, 200 ms, 400 ms (nack_delay * 2**redelivery_count), with some slack.
    assert 0.08 <= gaps[0] < 0.19, gaps
    assert 0.18 <= gaps[1] < 0.35, gaps
    assert 0.38 <= gaps[2] < 0.65, gaps


def test_ack_timeout_redelivers(client: Client, topic: str) -> None:
    produce(client, topic, 3)
    with client.push_consumer(topic, "at", "shared", initial_position="earliest", ack_timeout="300ms") as pc:
        first = drain(pc, 3, ack=False)
        assert all(m.redelivery_count == 0 for m in first)
        again = drain(pc, 3, timeout=5)  # never acked: back after the ack timeout
        assert sorted(m.message_id for m in again) == sorted(m.message_id for m in first)
        assert all(m.redelivery_count == 1 for m in again)
        assert nothing_more(pc, 0.6)  # acked now: not again


def test_dead_letter_after_max_redeliver(client: Client, topic: str) -> None:
    produce(client, topic, 2, key=lambda i: f"key{i}".encode())
    with client.push_consumer(
        topic, "dl", "shared", initial_position="earliest", nack_delay="50ms", max_redeliver=2
    ) as pc:
        deliveries: dict[bytes, list[int]] = {b"0": [], b"1": []}
        poison = None
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                msg = pc.receive(timeout=1.0)
            except TimeoutError:
                break
            deliveries[msg.value].append(msg.redelivery_count)
            if msg.value == b"1":
                poison = msg.message_id
                pc.nack(msg)  # always fails
            else:
                pc.ack(msg)
        assert deliveries[b"0"] == [0]
        assert deliveries[b"1"] == [0, 1, 2]  # then dead-lettered, never delivered again
        assert poison is not None
    dlq = dlq_topic(topic, "dl")
    assert dlq == f"{topic}.dl.DLQ"
    with client.push_consumer(dlq, "reader", "exclusive", initial_position="earliest") as reader:
        (dead,) = drain(reader, 1)
        assert dead.value == b"1"
        assert dead.key == b"key1"
        assert nothing_more(reader, 0.3)
