"""A fetcher waiting in ``fetch()`` reads its connection on its own thread (docs/latency.md, "Third pass").

Its answers reach it with no hand-off from the connection's reader thread; whatever else the
connection owes (a producer's answers on the same client) is still read, by the caller while it
reads or by the reader thread otherwise; and a fetcher that stops waiting (``poll_raw``) is read
for again by the thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from sluice import Client
from sluice.client.fetcher import Fetcher
from sluice.client.links import FetchLane
from sluice.client.producer import Producer
from sluice.errors import SluiceError

from .conftest import Cluster


def _fetch_each(fetcher: Fetcher, producer: Producer, n: int) -> list[bytes | None]:
    """Send ``n`` records one at a time, fetching each before the next is sent."""
    keys: list[bytes | None] = []
    for i in range(n):
        producer.send(b"v", key=b"%d" % i).result(timeout=10)
        deadline = time.monotonic() + 10
        while len(keys) <= i and time.monotonic() < deadline:
            keys += [r.key for r in fetcher.fetch(timeout=1)]
    return keys


def test_fetch_reads_its_answers_on_the_callers_thread(
    cluster: Cluster, client: Client, new_topic: Callable[..., str], putters: list[int]
) -> None:
    topic = new_topic(partitions=1)
    with (
        Client(cluster.bootstrap) as other,
        other.producer(topic, linger=0) as producer,
        client.fetcher({(topic, 0): 0}, max_wait_ms=2000) as fetcher,
    ):
        assert _fetch_each(fetcher, producer, 20) == [b"%d" % i for i in range(20)]
    # The first answer may come through the reader thread (the lane was not driven yet).
    assert putters[-10:] == [threading.get_ident()] * 10


def test_a_producer_on_the_same_client_is_answered_while_a_fetcher_drives(
    client: Client, new_topic: Callable[..., str]
) -> None:
    """Its acks are read by whoever reads then (the send wakes a resting reader thread)."""
    topic = new_topic(partitions=1)
    with (
        client.producer(topic, linger=0) as producer,
        client.fetcher({(topic, 0): 0}, max_wait_ms=2000) as fetcher,
    ):
        assert _fetch_each(fetcher, producer, 20) == [b"%d" % i for i in range(20)]


def test_a_fetcher_that_stops_waiting_is_read_for_by_the_thread(
    cluster: Cluster, client: Client, new_topic: Callable[..., str], putters: list[int]
) -> None:
    topic = new_topic(partitions=1)
    with (
        Client(cluster.bootstrap) as other,
        other.producer(topic, linger=0) as producer,
        client.fetcher({(topic, 0): 0}, max_wait_ms=2000) as fetcher,
    ):
        assert _fetch_each(fetcher, producer, 2) == [b"0", b"1"]  # drove its lane
        fetcher.poll_raw()  # a step that never waits: the reader thread reads for it again
        del putters[:]
        producer.send(b"v", key=b"2").result(timeout=10)
        deadline = time.monotonic() + 10
        while not fetcher._answers.waiting() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fetcher._answers.waiting()
        assert putters
        assert threading.get_ident() not in putters


def test_closing_a_fetcher_from_another_thread_ends_a_wait_in_its_socket(
    client: Client, new_topic: Callable[..., str]
) -> None:
    """``cancel`` interrupts the owner's ``poll``: nothing comes from the broker to end it."""
    topic = new_topic(partitions=1)
    with client.fetcher({(topic, 0): 0}, max_wait_ms=20_000) as fetcher:
        assert fetcher.fetch(timeout=0.2) == []  # drives its lane from now on
        closer = threading.Timer(0.3, fetcher.close)
        closer.start()
        started = time.monotonic()
        with contextlib.suppress(SluiceError):
            fetcher.fetch()  # one round: the broker would answer it only after 20 s
        assert time.monotonic() - started < 10
        closer.join()


def test_an_owner_away_longer_than_the_deadline_finds_its_connection_alive(
    cluster: Cluster, new_topic: Callable[..., str]
) -> None:
    """Nobody reads a driven lane while its owner is away: that time is not the broker's silence,
    so it is no RequestTimedOut (which would fail the connection and make the fetcher re-follow)."""
    topic = new_topic(partitions=1)
    with (
        Client(cluster.bootstrap, request_timeout=0.5) as short,  # a followed answer due every 0.6 s
        short.fetcher({(topic, 0): 0}, max_wait_ms=100) as fetcher,
    ):
        assert fetcher.fetch(timeout=0.3) == []  # drives its lane from now on
        lanes = [b.stream for b in fetcher._brokers.values()]
        assert len(lanes) == 1
        assert isinstance(lanes[0], FetchLane)
        sent = lanes[0].sent
        time.sleep(1.5)  # away: empty answers wait in the socket
        assert fetcher.fetch(timeout=0.3) == []
        assert lanes[0].sent == sent  # still the same followed fetch


def test_fetch_with_timeout_zero_reads_what_waits_in_the_socket(
    cluster: Cluster, client: Client, new_topic: Callable[..., str]
) -> None:
    """The reader thread rests once the lane drives: a zero-timeout fetch reads the socket itself."""
    topic = new_topic(partitions=1)
    with (
        Client(cluster.bootstrap) as other,
        other.producer(topic, linger=0) as producer,
        client.fetcher({(topic, 0): 0}, max_wait_ms=2000) as fetcher,
    ):
        assert _fetch_each(fetcher, producer, 1) == [b"0"]  # drives its lane from now on
        producer.send(b"v", key=b"1").result(timeout=10)
        keys: list[bytes | None] = []
        deadline = time.monotonic() + 10
        while not keys and time.monotonic() < deadline:
            keys = [r.key for r in fetcher.fetch(timeout=0)]
        assert keys == [b"1"]
