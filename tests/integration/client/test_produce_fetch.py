"""Produce and fetch through the SDK against real broker and coordinator processes."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from sluice import Client, Record
from sluice.client.producer import FutureRecordMetadata, RecordMetadata, key_partition
from sluice.errors import OffsetOutOfRange, SluiceError


def fetch_all(client: Client, topic: str, partitions: int, expected: int, **kw: Any) -> list[Record]:
    """Fetch from offset 0 of every partition until ``expected`` records came back."""
    out: list[Record] = []
    with client.fetcher({(topic, p): 0 for p in range(partitions)}, **kw) as f:
        deadline = time.monotonic() + 20
        while len(out) < expected and time.monotonic() < deadline:
            out += f.fetch(timeout=1.0)
    return out


def test_round_trip_keeps_order_per_partition_and_keys_on_their_partition(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=4)
    n = 3000
    sent: list[tuple[bytes, bytes, FutureRecordMetadata]] = []
    with client.producer(topic, linger="2ms", batch_size="16KiB") as producer:
        for i in range(n):
            key = f"key-{i % 37}".encode()
            value = f"value-{i}".encode()
            sent.append(
                (key, value, producer.send(value, key=key, tag=f"tag{i % 3}", headers={"i": b"%d" % i}))
            )
    metas = [f.result(timeout=0) for _, _, f in sent]  # close() delivered everything
    # The same key always lands on the same partition, and it is crc32(key) % 4.
    by_key: dict[bytes, set[int]] = defaultdict(set)
    for (key, _, _), m in zip(sent, metas, strict=True):
        by_key[key].add(m.partition)
        assert m.partition == key_partition(key, 4)
    assert all(len(ps) == 1 for ps in by_key.values())
    # Futures give dense offsets per partition, in send order.
    per_partition: dict[int, list[int]] = defaultdict(list)
    for m in metas:
        per_partition[m.partition].append(m.offset)
    for offsets in per_partition.values():
        assert offsets == list(range(len(offsets)))

    records = fetch_all(client, topic, 4, n)
    assert len(records) == n
    fetched = {(r.partition, r.offset): r for r in records}
    for (key, value, _), m in zip(sent, metas, strict=True):
        r = fetched[(m.partition, m.offset)]
        assert (r.key, r.value, r.topic) == (key, value, topic)
        assert r.tag == f"tag{int(value.split(b'-')[1]) % 3}"
        assert r.headers == {"i": value.split(b"-")[1]}
        assert r.timestamp == m.timestamp
    # Order within each partition is the send order.
    for p in range(4):
        got = [r.value for r in records if r.partition == p]
        want = [v for (_, v, _), m in zip(sent, metas, strict=True) if m.partition == p]
        assert got == want


def test_keyless_records_are_spread_by_the_sticky_partitioner(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=3)
    with client.producer(topic, batch_size="2KiB", linger="50ms") as producer:
        futs = [producer.send(b"x" * 100) for _ in range(600)]
    metas = [f.result() for f in futs]
    counts: dict[int, int] = defaultdict(int)
    for m in metas:
        counts[m.partition] += 1
    assert set(counts) == {0, 1, 2}
    # Sticky: consecutive records share a partition until a batch closes (~17 per 2 KiB batch).
    switches = sum(1 for a, b in itertools.pairwise(metas) if a.partition != b.partition)
    assert switches < 60


def test_flush_waits_for_every_record_and_close_is_final(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    producer = client.producer(topic, linger="10s")  # nothing would be sent before linger
    futs = [producer.send(b"v%d" % i, partition=i % 2) for i in range(10)]
    assert not any(f.done() for f in futs)
    started = time.monotonic()
    producer.flush(timeout=10)
    assert time.monotonic() - started < 5
    assert all(f.done() and f.exception() is None for f in futs)
    late = producer.send(b"late", partition=0)
    producer.close(timeout=10)
    assert late.result().offset == 5
    with pytest.raises(SluiceError, match="closed"):
        producer.send(b"after close")
    assert client.list_offsets(topic, "latest") == {0: 6, 1: 5}


def test_flush_nowait_returns_at_once_and_ships_every_open_batch_in_order(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    producer = client.producer(topic, linger="10s")  # lingering: nothing would go before 10 s
    try:
        futs = [producer.send(b"v%d" % i, partition=i % 2) for i in range(30)]
        assert not any(f.done() for f in futs)
        producer.flush_nowait()
        deadline = time.monotonic() + 5  # well inside the 10 s linger: shipped, not lingered
        while not all(f.done() for f in futs) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(f.done() and f.exception() is None for f in futs), "open batches left lingering"
        # Each partition's records at consecutive offsets in send order: pipelined, never reordered.
        for p in (0, 1):
            assert [f.result().offset for f in futs[p::2]] == list(range(15))
    finally:
        producer.close(timeout=10)


@pytest.mark.parametrize("linger", ["0ms", "20ms"])
def test_a_steady_stream_of_records_is_delivered_without_flush(
    client: Client, new_topic: Callable[..., str], linger: str
) -> None:
    """Only the producer's own wake-ups may send a lingering batch. Records every ~0.3 ms (closer
    than a round trip) land in a new batch while the partition's previous one is still in flight;
    once that is answered, the new batch must go out when its linger passes, with no flush(), no
    close() and no further batch to nudge the sender."""
    topic = new_topic(partitions=2)
    producer = client.producer(topic, linger=linger, partitioner="round_robin")
    futures = []
    for i in range(1_500):
        futures.append(producer.send(b"%d" % i))
        time.sleep(0.0003)
    deadline = time.monotonic() + 10
    for f in futures:
        f.result(timeout=max(deadline - time.monotonic(), 0.01))
    assert sum(client.list_offsets(topic, "latest").values()) == 1_500
    producer.close(timeout=10)


def test_callbacks_and_acks_zero(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    seen: list[RecordMetadata] = []
    with client.producer(topic, acks=0) as producer:
        for i in range(5):
            producer.send(b"%d" % i).add_done_callback(lambda f: seen.append(f.result()))
    assert len(seen) == 5
    assert [r.value for r in fetch_all(client, topic, 1, 5)] == [b"0", b"1", b"2", b"3", b"4"]


def test_list_offsets_earliest_latest_and_by_time(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=2)
    with client.producer(topic) as producer:
        for i in range(10):
            producer.send(b"v", partition=0, timestamp=1_000 + i)
    assert client.list_offsets(topic, "earliest") == {0: 0, 1: 0}
    assert client.list_offsets(topic, "latest") == {0: 10, 1: 0}
    assert client.list_offsets(topic, 1_004, partitions=[0]) == {0: 4}
    assert client.list_offsets(topic, 9_999, partitions=[0]) == {0: 10}


def test_filtered_fetch_skips_records_and_still_advances(
    client: Client, new_topic: Callable[..., str]
) -> None:
    topic = new_topic()
    with client.producer(topic) as producer:
        for i in range(30):
            producer.send(b"%d" % i, tag=("red", "blue", "green")[i % 3])
        producer.flush()
        for i in range(5):
            producer.send(b"g%d" % i, tag="green")
    with client.fetcher({(topic, 0): 0}, {topic: "red || blue"}) as f:
        got: list[Record] = []
        deadline = time.monotonic() + 10
        while f.positions()[(topic, 0)] < 35 and time.monotonic() < deadline:
            got += f.fetch(timeout=1.0)
        assert {r.tag for r in got} == {"red", "blue"}
        assert len(got) == 20
        assert [r.offset for r in got] == [i for i in range(30) if i % 3 != 2]
        # The trailing all-green run matched nothing, yet the position moved past it.
        assert f.positions() == {(topic, 0): 35}


def test_fetcher_long_polls_and_sees_new_records(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    with client.fetcher({(topic, 0): 0}, max_wait_ms=200) as f:
        started = time.monotonic()
        assert f.fetch() == []  # one round: the broker waited max_wait_ms
        assert 0.1 < time.monotonic() - started < 5
        with client.producer(topic) as producer:
            producer.send(b"hello")
        records = f.fetch(timeout=5)
        assert [r.value for r in records] == [b"hello"]
        assert f.positions() == {(topic, 0): 1}


def test_seek_and_many_incremental_rounds(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic(partitions=3)
    with client.producer(topic, linger="0ms") as producer:
        for i in range(300):
            producer.send(b"%d" % i, partition=i % 3)
    # Small partition_max_bytes: many rounds, so the session goes incremental.
    with client.fetcher({(topic, p): 0 for p in range(3)}, partition_max_bytes=200) as f:
        got: list[Record] = []
        deadline = time.monotonic() + 20
        while len(got) < 300 and time.monotonic() < deadline:
            got += f.fetch(timeout=1.0)
        assert sorted((r.partition, r.offset) for r in got) == sorted((i % 3, i // 3) for i in range(300))
        assert f.positions() == {(topic, p): 100 for p in range(3)}
        f.seek((topic, 1), 98)
        again = f.fetch(timeout=5)
        assert [(r.partition, r.offset) for r in again] == [(1, 98), (1, 99)]


def test_offset_out_of_range_policies(client: Client, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    with client.producer(topic) as producer:
        for i in range(3):
            producer.send(b"%d" % i)
    with client.fetcher({(topic, 0): 50}) as f:  # auto_offset_reset="none"
        with pytest.raises(OffsetOutOfRange, match="out of range") as exc:
            f.fetch(timeout=5)
        assert exc.value.fields["partition"] == 0
        f.seek((topic, 0), 1)
        assert [r.value for r in f.fetch(timeout=5)] == [b"1", b"2"]
    with client.fetcher({(topic, 0): 50}, auto_offset_reset="earliest") as f:
        assert [r.offset for r in f.fetch(timeout=5)] == [0, 1, 2]
    with client.fetcher({(topic, 0): 50}, auto_offset_reset="latest") as f:
        assert f.fetch(timeout=0.5) == []
        assert f.positions() == {(topic, 0): 3}
