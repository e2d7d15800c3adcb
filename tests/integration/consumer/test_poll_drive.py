"""A sync group consumer's ``poll()`` reads its own answers while it waits (docs/latency.md, "Fourth pass").

The polling thread claims the consumer's prefetcher, reads the connection itself and decodes what it
reads, so an answer reaches ``poll()`` with neither the connection's reader thread nor the Client's fetch
driver woken for it. Where that cannot be done alone (several consumers' lanes on the connection) it
falls back to the driver; something another thread has for the consumer (a rebalance, ``close()``) ends
its wait in the socket; a producer on the same Client keeps getting its acknowledgements.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from sluice import Client
from sluice.client.consumer import Consumer
from sluice.client.consumer.prefetch import Prefetcher
from sluice.client.producer import Producer

from .conftest import Cluster


@pytest.fixture
def driver_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per step the Client's fetch driver ran (each one a wake-up of its thread)."""
    seen: list[int] = []
    step = Prefetcher.step

    def counting(self: Prefetcher) -> float | None:
        seen.append(threading.get_ident())
        return step(self)

    monkeypatch.setattr(Prefetcher, "step", counting)
    return seen


@pytest.fixture
def client(cluster: Cluster) -> Iterator[Client]:
    with Client(cluster.bootstrap, request_timeout=10.0) as c:
        yield c


def _poll_each(consumer: Consumer, producer: Producer, n: int, start: int = 0) -> list[bytes | None]:
    """Send ``n`` records one at a time, each a moment after ``poll()`` started waiting for it (a consumer
    that waits for its records, the latency case; one behind them finds them buffered by the driver)."""
    keys: list[bytes | None] = []
    for i in range(start, start + n):
        sender = threading.Timer(0.02, lambda i=i: producer.send(b"v", key=b"%d" % i).result(timeout=10))
        sender.start()
        deadline = time.monotonic() + 10
        while len(keys) <= i - start and time.monotonic() < deadline:
            keys += [r.key for r in consumer.poll(timeout=1.0)]
        sender.join()
    return keys


def _group() -> str:
    return f"drive-{uuid.uuid4().hex[:8]}"


def test_poll_reads_its_answers_on_the_polling_thread(
    cluster: Cluster, client: Client, putters: list[int], driver_steps: list[int]
) -> None:
    """No other thread is woken for an answer: the fetch driver steps nothing, the answers are
    queued by the polling thread (before, by the connection's reader thread, for the driver)."""
    topic = cluster.topic(1, "drive")
    with (
        Client(cluster.bootstrap) as other,
        other.producer(topic, linger=0) as producer,
        client.consumer(_group(), [topic], auto_offset_reset="earliest") as consumer,
    ):
        assert _poll_each(consumer, producer, 5) == [b"%d" % i for i in range(5)]  # joined, driving
        del putters[:], driver_steps[:]
        assert _poll_each(consumer, producer, 20, start=5) == [b"%d" % i for i in range(5, 25)]
        me = threading.get_ident()
        # A heartbeat's event may end one wait early and hand one step back to the driver.
        assert sum(t == me for t in putters) >= len(putters) - 2 >= 18, putters
        assert len(driver_steps) <= 2, driver_steps


def test_consumers_sharing_a_client_each_get_all_their_records(cluster: Cluster, client: Client) -> None:
    """Three consumers of one Client (one connection), polled from their own threads at once: at most
    one reads the socket itself at a time, the others' lanes are read by the thread for the driver."""
    topic = cluster.topic(1, "drive-shared")
    n = 150
    consumers = [client.consumer(_group(), [topic], auto_offset_reset="earliest") for _ in range(3)]
    got: list[list[bytes | None]] = [[] for _ in consumers]

    def run(i: int) -> None:
        deadline = time.monotonic() + 30
        while len(got[i]) < n and time.monotonic() < deadline:
            got[i] += [r.key for r in consumers[i].poll(timeout=0.5)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(consumers))]
    for t in threads:
        t.start()
    try:
        with Client(cluster.bootstrap) as other, other.producer(topic, linger=0) as producer:
            for i in range(n):
                producer.send(b"v", key=b"%d" % i)
                time.sleep(0.002)  # a paced stream: consumers wait between records
            producer.flush()
        for t in threads:
            t.join(40)
    finally:
        for c in consumers:
            c.close()
    assert [len(g) for g in got] == [n] * len(consumers)
    assert all(g == [b"%d" % i for i in range(n)] for g in got)


def test_one_thread_polling_two_consumers_of_a_client_gets_everything(
    cluster: Cluster, client: Client
) -> None:
    """Alternate polls: whichever drives reads the other's answers too, and hands them to its driver."""
    topic = cluster.topic(1, "drive-alternate")
    with (
        Client(cluster.bootstrap) as other,
        other.producer(topic, linger=0) as producer,
        client.consumer(_group(), [topic], auto_offset_reset="earliest") as a,
        client.consumer(_group(), [topic], auto_offset_reset="earliest") as b,
    ):
        got: dict[str, list[bytes | None]] = {"a": [], "b": []}
        for i in range(30):
            producer.send(b"v", key=b"%d" % i).result(timeout=10)
            deadline = time.monotonic() + 10
            while min(len(g) for g in got.values()) <= i and time.monotonic() < deadline:
                for name, c in (("a", a), ("b", b)):
                    if len(got[name]) <= i:
                        got[name] += [r.key for r in c.poll(timeout=0.2)]
        assert got["a"] == got["b"] == [b"%d" % i for i in range(30)]


def test_close_from_another_thread_ends_a_poll_waiting_in_the_socket(
    cluster: Cluster, client: Client
) -> None:
    topic = cluster.topic(1, "drive-close")
    with Client(cluster.bootstrap) as other, other.producer(topic, linger=0) as producer:
        consumer = client.consumer(
            _group(), [topic], auto_offset_reset="earliest", fetch_max_wait="30s", enable_auto_commit=False
        )
        assert _poll_each(consumer, producer, 2) == [b"0", b"1"]
    claimed: list[bool] = []

    def close() -> None:
        claimed.append(consumer._prefetch._claimant is not None)  # poll() runs the steps: it drives
        consumer.close()

    closer = threading.Timer(0.5, close)
    closer.start()
    started = time.monotonic()
    assert consumer.poll(timeout=30) == []
    assert time.monotonic() - started < 10
    closer.join()
    assert claimed == [True]


def test_a_rebalance_ends_a_poll_waiting_in_the_socket(cluster: Cluster, client: Client) -> None:
    """A member that waits in one long poll() on an idle topic gives up a partition to a joining member
    at once: the group's event ends its wait in the socket (the broker would answer only after 30 s)."""
    topic = cluster.topic(2, "drive-rebalance")
    group = _group()
    revoked: list[tuple[str, int]] = []
    first = client.consumer(
        group,
        [topic],
        auto_offset_reset="earliest",
        fetch_max_wait="30s",
        enable_auto_commit=False,
        on_revoke=revoked.extend,
    )
    try:
        deadline = time.monotonic() + 10
        while len(first.assignment()) < 2 and time.monotonic() < deadline:
            first.poll(timeout=0.2)
        assert len(first.assignment()) == 2
        started = time.monotonic()
        polled: list[float] = []

        def wait_long() -> None:
            first.poll(timeout=12)
            polled.append(time.monotonic())

        poller = threading.Thread(target=wait_long)
        poller.start()
        time.sleep(0.5)
        assert first._prefetch._claimant is not None  # waiting in the socket
        with Client(cluster.bootstrap, request_timeout=10.0) as other:
            second = other.consumer(group, [topic], auto_offset_reset="earliest")
            try:
                # Within the first member's one poll(timeout=12): its wait in the socket was ended.
                deadline = started + 8
                while not second.assignment() and time.monotonic() < deadline:
                    second.poll(timeout=0.2)
                assert second.assignment(), "the waiting member never gave up a partition"
                assert revoked
            finally:
                second.close()
        poller.join(20)
        assert polled  # its poll() went on waiting after the rebalance, and ended
    finally:
        first.close()


def test_a_producer_on_the_consumers_client_is_answered_while_poll_drives(
    cluster: Cluster, client: Client
) -> None:
    """Consume-transform-produce on one Client: the acknowledgements are read by whoever reads then."""
    source, sink = cluster.topic(1, "drive-src"), cluster.topic(1, "drive-sink")
    with (
        Client(cluster.bootstrap) as other,
        other.producer(source, linger=0) as feeder,
        client.producer(sink, linger=0) as producer,
        client.consumer(_group(), [source], auto_offset_reset="earliest") as consumer,
    ):
        moved = 0
        for i in range(20):
            feeder.send(b"v", key=b"%d" % i).result(timeout=10)
            deadline = time.monotonic() + 10
            while moved <= i and time.monotonic() < deadline:
                for r in consumer.poll(timeout=1.0):
                    producer.send(r.value, key=r.key).result(timeout=10)
                    moved += 1
        assert moved == 20


def test_poll_with_timeout_zero_reads_what_waits_in_the_socket(cluster: Cluster, client: Client) -> None:
    """Once poll() drives, the reader thread leaves the lane's answers in the socket: a poll(0) (no wait)
    must still read them, or a loop of poll(0) would never see another record."""
    topic = cluster.topic(1, "drive-zero")
    with (
        Client(cluster.bootstrap) as other,
        other.producer(topic, linger=0) as producer,
        client.consumer(_group(), [topic], auto_offset_reset="earliest") as consumer,
    ):
        sent = 0
        while sent < 20 and (sent < 3 or not consumer._prefetch.in_socket):
            # Until poll() took the lane over (an answer the reader thread read meanwhile hands it back)
            assert _poll_each(consumer, producer, 1, start=sent) == [b"%d" % sent]
            sent += 1
        assert consumer._prefetch.in_socket  # the connection's thread rests for this lane
        producer.send(b"v", key=b"%d" % sent).result(timeout=10)
        got: list[bytes | None] = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got += [r.key for r in consumer.poll(timeout=0)]
            time.sleep(0.01)
        assert got == [b"%d" % sent]
