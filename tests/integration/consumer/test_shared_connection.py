"""One wire connection per broker per Client, shared by its producers and consumers (docs/wire.md,
"Lanes"; issue 20).

Many group consumers and a producer on one Client: the broker counts one connection (its
``sluice_broker_wire_connections`` and this process's sockets agree), and everyone gets their
records. One consumer that stops polling holds a bounded number of answers and stops nobody
else: another consumer's records and the producer's acknowledgements keep coming.
``bench/shared_connection.py`` runs the first scenario with 1,000 consumers.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

from sluice import Client
from sluice.client.consumer import Consumer
from sluice.client.fetcher import _FOLLOW_WINDOW
from tests.wire_client import settle_connections, sockets_to, wire_connections

from .conftest import Cluster

#: Consumers in the many-consumers test: enough to show the sharing and that a consumer adds no
#: thread (the Client's group and fetch drivers serve them all: docs/consumer.md).
CONSUMERS = int(os.environ.get("SLUICE_TEST_SHARED_CONSUMERS", "100"))


def _poll_until(consumer: Consumer, n: int, timeout: float) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += [r.value for r in consumer.poll(timeout=1.0)]
    return got


def test_many_consumers_and_a_producer_on_one_client_share_one_connection(cluster: Cluster) -> None:
    topic = f"shared-{uuid.uuid4().hex[:8]}"
    settle_connections(cluster.broker.metrics, "broker", 0)
    with Client(cluster.bootstrap, request_timeout=30) as client:
        client.admin.create_topic(topic, partitions=2)
        (broker,) = client.metadata(refresh=True).brokers.values()
        assert broker.wire_address is not None
        wire_port = int(broker.wire_address.rsplit(":", 1)[1])
        # The first consumer starts the Client's drivers; the others add no thread.
        consumers = [client.consumer(f"g0-{topic}", [topic], auto_offset_reset="earliest")]
        threads_with_one = threading.active_count()
        for i in range(1, CONSUMERS):
            consumers.append(client.consumer(f"g{i}-{topic}", [topic], auto_offset_reset="earliest"))
        # gRPC may start a helper thread of its own meanwhile; a thread per consumer would be 99 more.
        assert threading.active_count() <= threads_with_one + 2, (threads_with_one, threading.active_count())
        try:
            with client.producer(topic, linger="5ms") as producer:
                futures = [producer.send(b"r%d" % i, partition=i % 2) for i in range(20)]
                for f in futures:
                    f.result(timeout=30)
                expected = sorted(b"r%d" % i for i in range(20))
                for c in consumers:
                    assert sorted(_poll_until(c, 20, 30)) == expected
                # Every consumer is following its partitions and the producer is open: one connection.
                assert client._links.connections() == 1
                assert sockets_to(wire_port) == 1
                assert wire_connections(cluster.broker.metrics, "broker") == 1
                # And it keeps carrying everyone: one more record each.
                producer.send(b"late", partition=0).result(timeout=30)
                for c in consumers:
                    assert _poll_until(c, 1, 30) == [b"late"]
        finally:
            for c in consumers:
                c.close()
    settle_connections(cluster.broker.metrics, "broker", 0)


def test_a_consumer_that_stops_polling_stops_nobody_else_on_its_client(cluster: Cluster) -> None:
    topic = f"slow-{uuid.uuid4().hex[:8]}"
    value = b"x" * 1000
    with Client(cluster.bootstrap, request_timeout=30) as client:
        client.admin.create_topic(topic, partitions=1)
        settings: dict[str, Any] = {"auto_offset_reset": "earliest", "partition_max_bytes": 64 * 1024}
        # A small prefetch buffer: the idle consumer's buffer fills after a few answers, and then
        # only the broker's lane window holds anything more for it.
        idle = client.consumer(f"idle-{topic}", [topic], buffer_max_bytes=256 * 1024, **settings)
        busy = client.consumer(f"busy-{topic}", [topic], **settings)
        try:
            with client.producer(topic) as producer:
                for i in range(5_000):
                    producer.send(value, key=b"%d" % i)
                producer.flush(timeout=30)
                first = idle.poll(timeout=10)  # then never again until the end
                assert first
                # ~5 MB for 'busy', while 'idle' holds its lane: a shared reader thread blocked
                # on it (or a connection stopped by it) would stall all of this.
                keys: list[bytes] = []
                deadline = time.monotonic() + 60
                while len(keys) < 5_000 and time.monotonic() < deadline:
                    keys += [r.key or b"" for r in busy.poll(timeout=1.0)]
                assert keys == [b"%d" % i for i in range(5_000)]
                # The producer's acknowledgements come too, each within a few seconds.
                for i in range(5_000, 5_200):
                    producer.send(value, key=b"%d" % i).result(timeout=10)
                tail = _poll_until(busy, 200, 30)
                assert len(tail) == 200
                # 'idle' holds what it prefetched and what its lane's window let the broker send:
                # at most the window's answers wait unread (client/fetcher.py), however many
                # records each answer carries (that depends on the producer's batch size).
                fetcher = idle._prefetch._fetcher
                assert fetcher._answers.waiting() <= _FOLLOW_WINDOW
            # 'idle' resumes and misses nothing.
            idle_keys = [r.key or b"" for r in first]
            deadline = time.monotonic() + 60
            while len(idle_keys) < 5_200 and time.monotonic() < deadline:
                idle_keys += [r.key or b"" for r in idle.poll(timeout=1.0)]
            assert idle_keys == [b"%d" % i for i in range(5_200)]
        finally:
            idle.close()
            busy.close()
