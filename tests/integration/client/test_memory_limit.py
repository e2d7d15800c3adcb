"""A Client's ``memory_limit`` (docs/memory.md, "SDK") on a real cluster.

Two group consumers and a push consumer of one Client, each with a backlog several times the
limit, while the application does not poll: together they hold no more than the limit plus what
was already on its way when it was reached (per group consumer one fetch round of
``fetch_max_bytes`` and its pipelined next; per push consumer the permits it had granted). Each
consumer alone would buffer far more (``buffer_max_bytes`` 32 MiB, ``receiver_queue_size``
messages). Then the application reads everything: every record arrives once, none is lost.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from sluice import Client
from sluice.client.push.flow import INITIAL_WINDOW
from tests.integration.push.conftest import PushCluster, run_push_cluster

KiB = 1024
MiB = 1024 * KiB
LIMIT = 1 * MiB
VALUE = 8 * KiB
RECORDS = 512  # 4 MiB per topic: four times the limit
FETCH_MAX = 128 * KiB
QUEUE = 16  # push permits: 16 x 8 KiB may be on their way when the limit is reached


@pytest.fixture(scope="module")
def cluster() -> Iterator[PushCluster]:
    with run_push_cluster() as c:
        yield c


def _produce(client: Client, topic: str) -> set[bytes]:
    values = {f"{topic}-{i}-".encode().ljust(VALUE, b".") for i in range(RECORDS)}
    # Small batches: a fetch returns at least one whole batch per partition, whatever its max_bytes.
    with client.producer(topic, linger="5ms", batch_size="32KiB") as producer:
        futures = [producer.send(v) for v in sorted(values)]
        producer.flush()
        for f in futures:
            f.result()
    return values


def _settle(client: Client, seconds: float) -> int:
    """Wait ``seconds`` (consumers keep prefetching meanwhile); the most held at once."""
    deadline = time.monotonic() + seconds
    peak = 0
    while time.monotonic() < deadline:
        peak = max(peak, client.memory.used)
        time.sleep(0.05)
    return max(peak, client.memory.peak)


def test_consumers_of_one_client_hold_at_most_its_memory_limit(cluster: PushCluster) -> None:
    tag = uuid.uuid4().hex[:6]
    group_topics = [f"mem-g{i}-{tag}" for i in range(2)]
    push_topic = f"mem-p-{tag}"
    with Client(cluster.bootstrap, request_timeout=10) as admin_client:
        for t in [*group_topics, push_topic]:
            admin_client.admin.create_topic(t, partitions=2)
    with Client(cluster.bootstrap, request_timeout=10, memory_limit=LIMIT) as client:
        consumers = [
            client.consumer(
                f"g-{t}",
                t,
                auto_offset_reset="earliest",
                fetch_max_bytes=FETCH_MAX,
                partition_max_bytes=FETCH_MAX // 2,
            )
            for t in group_topics
        ]
        pc = client.push_consumer(push_topic, f"s-{tag}", "shared", receiver_queue_size=QUEUE)
        got: dict[str, list[bytes]] = {t: [] for t in [*group_topics, push_topic]}
        for c, t in zip(consumers, group_topics, strict=True):
            got[t] += [r.value for r in c.poll(timeout=2, max_records=1)]  # takes its assignment
        expected = {t: _produce(client, t) for t in [*group_topics, push_topic]}

        peak = _settle(client, 4.0)
        bound = LIMIT + len(consumers) * 2 * FETCH_MAX + QUEUE * (VALUE + KiB)
        print(f"memory_limit {LIMIT >> 10} KiB: peak held {peak >> 10} KiB (bound {bound >> 10} KiB)")
        assert peak <= bound, f"held {peak} bytes with memory_limit={LIMIT}"
        assert client.memory.used >= LIMIT * 0.9, "the consumers did not prefetch up to the limit"
        assert client.memory.stops > 0

        # The application reads everything now: every record once, nothing lost.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and any(len(got[t]) < RECORDS for t in expected):
            for c, t in zip(consumers, group_topics, strict=True):
                got[t] += [r.value for r in c.poll(timeout=0.05)]
            while len(got[push_topic]) < RECORDS:
                try:
                    msg = pc.receive(timeout=0.05)
                except TimeoutError:
                    break
                got[push_topic].append(msg.value)
                pc.ack(msg)
        for t, values in expected.items():
            assert len(got[t]) == RECORDS, (t, len(got[t]))
            assert set(got[t]) == values, t
        for c in consumers:
            c.close()
        pc.close()
        assert client.memory.used == 0  # closing released what they held


def test_a_push_consumer_grants_no_permits_while_the_client_is_at_its_limit(cluster: PushCluster) -> None:
    """Two push consumers of one Client with auto-scaled windows (PIP-74): while the second's unread
    queue holds the Client's limit, its window does not grow past where it started, and the first,
    having taken its own first window, grants nothing; once the second is drained, the first's refill
    goes out (woken on the memory's own thread) and the rest of its messages come."""
    tag = uuid.uuid4().hex[:6]
    topics = [f"mem-pa-{tag}", f"mem-pb-{tag}"]
    queue, records = 32, 96
    with Client(cluster.bootstrap, request_timeout=10) as admin_client:
        for t in topics:
            admin_client.admin.create_topic(t, partitions=1)
    with Client(cluster.bootstrap, request_timeout=10, memory_limit=48 * KiB) as client:
        first, second = (
            client.push_consumer(t, f"s-{tag}", "shared", receiver_queue_size=queue) for t in topics
        )
        expected = {t: _produce_n(client, t, records) for t in topics}
        deadline = time.monotonic() + 20
        while second.stats().flow.queued < INITIAL_WINDOW and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # room for a wrong grant to land
        # Its first window only (8 x 8 KiB, over the 48 KiB limit), never its whole share of 32.
        assert second.stats().flow.queued == INITIAL_WINDOW
        got: dict[str, list[bytes]] = {t: [] for t in topics}
        for _ in range(INITIAL_WINDOW):
            msg = first.receive(timeout=20)
            got[topics[0]].append(msg.value)
            first.ack(msg)
        granted = first.stats().flow.permits_granted
        time.sleep(0.5)
        assert first.stats().flow.permits_granted == granted == INITIAL_WINDOW, "granted while at the limit"
        assert client.memory.stops > 0
        # The application reads both now (the limit is the Client's: one consumer's queue can
        # hold the room another needs, so each must be read for the other to go on).
        deadline = time.monotonic() + 60
        while any(len(got[t]) < records for t in topics) and time.monotonic() < deadline:
            for pc, t in ((first, topics[0]), (second, topics[1])):
                try:
                    msg = pc.receive(timeout=0.05)
                except TimeoutError:
                    continue
                got[t].append(msg.value)
                pc.ack(msg)
        assert first.stats().flow.permits_granted > INITIAL_WINDOW
        for t in topics:
            assert len(got[t]) == records
            assert set(got[t]) == expected[t]
        first.close()
        second.close()
        assert client.memory.used == 0


def _produce_n(client: Client, topic: str, n: int) -> set[bytes]:
    values = {f"{topic}-{i}-".encode().ljust(VALUE, b".") for i in range(n)}
    with client.producer(topic, linger="5ms", batch_size="32KiB") as producer:
        futures = [producer.send(v) for v in sorted(values)]
        producer.flush()
        for f in futures:
            f.result()
    return values
