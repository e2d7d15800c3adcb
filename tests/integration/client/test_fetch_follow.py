"""The fetcher follows a continuous fetch on the broker's wire port (docs/wire.md).

One request serves answer after answer; whatever changes what the fetcher wants (a seek, a
filter, a partition removed) replaces it; and a fetcher whose caller stops calling ``fetch()``
holds at most a couple of answers, however large the backlog.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from sluice import Client
from sluice.client.fetcher import Fetcher, RawChunk
from sluice.client.links import FetchLane
from sluice.client.producer import Producer
from sluice.codec.batch import decode_records

from .conftest import run_cluster


def _requests_sent(fetcher: Fetcher) -> int:
    """How many fetch requests the fetcher's wire lanes have sent."""
    links = [b.stream for b in fetcher._brokers.values()]
    assert links
    wire = [link for link in links if isinstance(link, FetchLane)]
    assert len(wire) == len(links), links
    return sum(link.sent for link in wire)


def _answers_waiting(fetcher: Fetcher) -> int:
    """Answers arrived and not yet handed back: queued, or held by the last ``fetch()``."""
    return fetcher._answers.waiting()


def _values(fetcher: Fetcher, expected: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < expected and time.monotonic() < deadline:
        got += [r.value for r in fetcher.fetch(timeout=5)]
    return got


@contextlib.contextmanager
def _producer_and_fetcher(client: Client, topic: str, partitions: int) -> Iterator[tuple[Producer, Fetcher]]:
    """A producer that sends each record at once, and a fetcher of every partition from 0."""
    with (
        client.producer(topic, linger=0) as producer,
        client.fetcher({(topic, p): 0 for p in range(partitions)}, max_wait_ms=200) as fetcher,
    ):
        yield producer, fetcher


def test_one_request_serves_a_steady_stream(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2)
    with _producer_and_fetcher(client, topic, 2) as (producer, fetcher):
        got: list[bytes] = []
        for i in range(30):
            producer.send(b"v%d" % i, partition=i % 2).result(timeout=10)
            got += _values(fetcher, 1)
        assert sorted(got) == sorted(b"v%d" % i for i in range(30))
        # Request by request this would be about 30: one per answer.
        assert _requests_sent(fetcher) <= 2


def test_a_seek_while_following_reads_from_the_new_position(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    with _producer_and_fetcher(client, topic, 1) as (producer, fetcher):
        for i in range(10):
            producer.send(b"v%d" % i).result(timeout=10)
        assert _values(fetcher, 10) == [b"v%d" % i for i in range(10)]
        fetcher.seek((topic, 0), 3)
        assert _values(fetcher, 7) == [b"v%d" % i for i in range(3, 10)]
        producer.send(b"v10").result(timeout=10)
        assert _values(fetcher, 1) == [b"v10"]
        assert fetcher.positions() == {(topic, 0): 11}


def test_a_filter_set_while_following_applies_to_what_comes_next(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    with _producer_and_fetcher(client, topic, 1) as (producer, fetcher):
        producer.send(b"a1", tag="a").result(timeout=10)
        producer.send(b"b1", tag="b").result(timeout=10)
        assert _values(fetcher, 2) == [b"a1", b"b1"]
        fetcher.set_filter(topic, "b")
        fetcher.fetch(timeout=0.3)  # the new filter goes out with the next round
        producer.send(b"a2", tag="a").result(timeout=10)
        producer.send(b"b2", tag="b").result(timeout=10)
        assert _values(fetcher, 1) == [b"b2"]
        assert fetcher.positions() == {(topic, 0): 4}  # past the filtered-out record too


def test_a_removed_partition_is_no_longer_fetched(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2)
    with _producer_and_fetcher(client, topic, 2) as (producer, fetcher):
        producer.send(b"p0", partition=0).result(timeout=10)
        producer.send(b"p1", partition=1).result(timeout=10)
        assert sorted(_values(fetcher, 2)) == [b"p0", b"p1"]
        fetcher.remove((topic, 1))
        fetcher.fetch(timeout=0.3)
        producer.send(b"p1-late", partition=1).result(timeout=10)
        producer.send(b"p0-late", partition=0).result(timeout=10)
        assert _values(fetcher, 1) == [b"p0-late"]
        assert fetcher.fetch(timeout=0.5) == []


def test_a_caller_that_stops_fetching_holds_few_answers_and_loses_nothing(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=1)
    value = b"x" * 1000
    with client.producer(topic) as producer:
        for i in range(20_000):  # about 20 MB: 320 answers of 64 KiB
            producer.send(value, key=b"%d" % i)
        producer.flush()
    with client.fetcher({(topic, 0): 0}, max_wait_ms=200, partition_max_bytes=64 * 1024) as fetcher:
        first = fetcher.fetch(timeout=10)
        assert first
        time.sleep(1.5)  # the broker could send the whole backlog meanwhile
        assert fetcher._answers.waiting() <= 2
        keys = [r.key for r in first]
        deadline = time.monotonic() + 60
        while len(keys) < 20_000 and time.monotonic() < deadline:
            keys += [r.key for r in fetcher.fetch(timeout=5)]
        assert keys == [b"%d" % i for i in range(20_000)]


def test_each_fetch_hands_back_one_answer_when_several_arrived(
    client: Client, new_topic: Callable[..., str]
) -> None:
    """Answers that arrived while the caller was busy wait for the next calls, one per call: a
    call decoding every queued answer cost 20-25% more CPU per record (docs/architecture.md)."""
    topic = new_topic(partitions=1)
    value = b"x" * 6000
    with client.producer(topic, linger=0) as producer:
        for i in range(8):  # one batch each: a 10,000-byte answer carries exactly one
            producer.send(value, key=b"%d" % i).result(timeout=10)
    with client.fetcher({(topic, 0): 0}, max_wait_ms=200, partition_max_bytes=10_000) as fetcher:
        assert [r.key for r in fetcher.fetch(timeout=10)] == [b"0"]
        # The window's two answers arrive meanwhile; they wait in the socket (the caller reads
        # it itself when it fetches: docs/latency.md, "Third pass"), then both in its queue.
        time.sleep(0.3)
        assert [r.key for r in fetcher.fetch()] == [b"1"]
        assert _answers_waiting(fetcher) <= 1  # read with "1" in one receive, it waits for the next call
        deadline = time.monotonic() + 10
        keys: list[bytes | None] = [b"0", b"1"]
        while len(keys) < 8 and time.monotonic() < deadline:
            got = [r.key for r in fetcher.fetch(timeout=5)]
            assert len(got) <= 1
            keys += got
        assert keys == [b"%d" % i for i in range(8)]


def test_each_poll_raw_takes_one_answer_when_several_arrived(
    client: Client, new_topic: Callable[..., str]
) -> None:
    """The group consumer's step (``poll_raw``) follows the same rule as ``fetch()``: one followed
    answer per call, the next held and due at once (wait 0). Taking every queued answer decoded
    up to three answers per step: +25% CPU per record in the group consumer (docs/architecture.md)."""
    topic = new_topic(partitions=1)
    value = b"x" * 6000
    with client.producer(topic, linger=0) as producer:
        for i in range(8):  # one batch each: a 10,000-byte answer carries exactly one
            producer.send(value, key=b"%d" % i).result(timeout=10)

    def keys_of(chunks: list[RawChunk]) -> list[bytes | None]:
        return [r.key for c in chunks for r in decode_records(c.data, c.topic, c.partition, c.start, True)]

    with client.fetcher({(topic, 0): 0}, max_wait_ms=200, partition_max_bytes=10_000) as fetcher:
        deadline = time.monotonic() + 10
        first: list[bytes | None] = []
        while not first and time.monotonic() < deadline:  # poll_raw never waits: threads read for it
            first = keys_of(fetcher.poll_raw()[0])
            time.sleep(0.01)
        assert first == [b"0"]
        while _answers_waiting(fetcher) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _answers_waiting(fetcher) == 2  # the window: two more answers arrived
        chunks, wait = fetcher.poll_raw()
        assert keys_of(chunks) == [b"1"]  # the other one is held for the next call
        assert wait == 0.0  # ... which is due at once
        keys: list[bytes | None] = [b"0", b"1"]
        while len(keys) < 8 and time.monotonic() < deadline:
            chunks, wait = fetcher.poll_raw()
            assert len(chunks) <= 1
            keys += keys_of(chunks)
            if not chunks:
                time.sleep(0.01)
        assert keys == [b"%d" % i for i in range(8)]


def test_a_fetcher_following_a_broker_that_is_killed_goes_on_after_its_restart() -> None:
    """kill -9, then a restart on new ports: the followed connection fails, the fetcher learns the
    new address from the coordinator, follows again from its positions, and misses nothing."""
    with run_cluster() as cluster, Client(cluster.bootstrap, request_timeout=5) as client:
        topic = "follow-restart"
        client.admin.create_topic(topic, partitions=2)
        with client.fetcher({(topic, 0): 0, (topic, 1): 0}, max_wait_ms=200) as fetcher:
            with client.producer(topic, linger=0) as producer:
                for i in range(10):
                    producer.send(b"before-%d" % i, partition=i % 2).result(timeout=10)
            got = _values(fetcher, 10)
            cluster.restart_broker(kill=True)
            with client.producer(topic, linger=0) as producer:
                for i in range(10):
                    producer.send(b"after-%d" % i, partition=i % 2).result(timeout=30)
            deadline = time.monotonic() + 30
            while len(got) < 20 and time.monotonic() < deadline:
                got += [r.value for r in fetcher.fetch(timeout=2)]
            assert sorted(got) == sorted(
                [b"before-%d" % i for i in range(10)] + [b"after-%d" % i for i in range(10)]
            )
            assert fetcher.positions() == {(topic, 0): 10, (topic, 1): 10}
