"""The bulk APIs against real services: ``Producer.send_many`` and ``Consumer.poll_columns``.

send_many: every record arrives once, in the call's order per partition, with its key, headers and tag,
through small batches and a full buffer; a bad call is refused whole with send()'s typed error.
poll_columns: the same records as poll() (differential, also when a consumer switches between the
two), the same positions and commits, and a group that rebalances while its members poll columns
loses and repeats nothing.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from sluice.client.consumer import Consumer
from sluice.codec.batch import Record
from sluice.errors import BatchTooLarge, InvalidArgument, SluiceError, UnknownTopicOrPartition
from tests.integration.consumer.conftest import Cluster

FAST: dict[str, Any] = {"session_timeout": "5s", "fetch_max_wait": "100ms"}
Row = tuple[int, int, bytes | None, bytes, str | None, dict[str, bytes], int]


def row(r: Record) -> Row:
    return (r.partition, r.offset, r.key, r.value, r.tag, r.headers, r.timestamp)


def records_of(n: int, start: int = 0) -> tuple[list[bytes], list[bytes | None], list[Any], list[Any]]:
    """Values, keys (every 7th record keyless), headers (every 3rd) and tags (every 5th)."""
    values = [b"v%d" % i for i in range(start, start + n)]
    keys = [None if i % 7 == 0 else b"key-%d" % (i % 13) for i in range(start, start + n)]
    headers = [{"h": b"%d" % i} if i % 3 == 0 else None for i in range(start, start + n)]
    tags = [f"t{i % 2}" if i % 5 == 0 else None for i in range(start, start + n)]
    return values, keys, headers, tags


def read_all(cluster: Cluster, topic: str, partitions: int, total: int) -> list[Record]:
    got: list[Record] = []
    with cluster.client().fetcher({(topic, p): 0 for p in range(partitions)}) as f:
        deadline = time.monotonic() + 20
        while len(got) < total:
            assert time.monotonic() < deadline, f"read {len(got)} of {total}"
            got += f.fetch(timeout=0.5)
    return got


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_send_many_delivers_every_record_once_in_order_with_keys_headers_and_tags(
    cluster: Cluster, compression: str
) -> None:
    topic = cluster.topic(4, "bulk")
    n, calls = 300, 3
    sent: list[tuple[bytes, bytes | None, Any, Any]] = []
    metas = []
    with cluster.client().producer(topic, compression=compression) as p:
        for c in range(calls):
            values, keys, headers, tags = records_of(n, c * n)
            fut = p.send_many(values, keys, headers=headers, tags=tags)
            assert len(fut) == n
            metas += fut.result(timeout=20)
            sent += zip(values, keys, headers, tags, strict=True)
    assert len(metas) == n * calls
    stored = {(r.partition, r.offset): r for r in read_all(cluster, topic, 4, n * calls)}
    assert len(stored) == n * calls
    last: dict[int, int] = {}
    for (value, key, headers, tag), meta in zip(sent, metas, strict=True):
        r = stored[(meta.partition, meta.offset)]
        assert (r.value, r.key, r.headers, r.tag) == (value, key, headers or {}, tag)
        if key is not None:
            assert meta.partition == zlib.crc32(key) % 4
        # Per partition, the call's order (and the calls' order) is the offsets' order.
        assert meta.offset > last.get(meta.partition, -1)
        last[meta.partition] = meta.offset


def test_send_many_through_small_batches_and_a_full_buffer(cluster: Cluster) -> None:
    topic = cluster.topic(2, "bulk-small")
    values = [b"%06d" % i + b"x" * 200 for i in range(3000)]
    keys = [b"k%d" % (i % 2) for i in range(3000)]
    # 4 KiB batches: a call spans many; an 16 KiB buffer: send_many waits for acknowledgements to go on.
    with cluster.client().producer(topic, batch_size="4KiB", buffer_memory="16KiB", linger="1ms") as p:
        futures = [p.send_many(values[i : i + 500], keys[i : i + 500]) for i in range(0, 3000, 500)]
        metas = [m for f in futures for m in f.result(timeout=30)]
    by_partition: dict[int, list[bytes]] = {}
    for r in sorted(read_all(cluster, topic, 2, 3000), key=lambda r: (r.partition, r.offset)):
        by_partition.setdefault(r.partition, []).append(r.value)
    for part, got in by_partition.items():
        expected = [v for v, k in zip(values, keys, strict=True) if zlib.crc32(k) % 2 == part]
        assert got == expected  # once each, in order
    assert sorted((m.partition, m.offset) for m in metas) == sorted(
        (p, o) for p, vs in by_partition.items() for o in range(len(vs))
    )


def test_send_many_refuses_a_bad_call_whole(cluster: Cluster) -> None:
    topic = cluster.topic(2, "bulk-bad")
    client = cluster.client()
    with client.producer(topic, batch_size="16KiB", max_request_size="64KiB") as p:
        good = [b"a", b"b"]
        bad_calls: list[tuple[type[SluiceError], dict[str, Any]]] = [
            (InvalidArgument, {"values": b"not a list"}),
            (InvalidArgument, {"values": [b"a", 3]}),
            (InvalidArgument, {"values": good, "keys": [b"k"]}),
            (InvalidArgument, {"values": good, "keys": [b"k", "str"]}),
            (InvalidArgument, {"values": good, "headers": [None, {"h": "not bytes"}]}),
            (InvalidArgument, {"values": good, "tags": [None, "bad tag!"]}),
            (InvalidArgument, {"values": good, "timestamp": -1}),
            (UnknownTopicOrPartition, {"values": good, "partition": 2}),
            (BatchTooLarge, {"values": [b"a", b"x" * 100_000]}),
        ]
        for error, kwargs in bad_calls:
            with pytest.raises(error):
                p.send_many(**kwargs)
        # Nothing of a refused call was queued: only the good call's records are in the topic.
        p.send_many([b"ok1", b"ok2"], partition=1).result(timeout=10)
    assert client.list_offsets(topic, "latest") == {0: 0, 1: 2}


def poll_rows(c: Consumer, n: int, columns: bool, max_records: int | None = None) -> list[Row]:
    got: list[Row] = []
    deadline = time.monotonic() + 20
    while len(got) < n:
        assert time.monotonic() < deadline, f"polled {len(got)} of {n}"
        if columns:
            for cols in c.poll_columns(0.2, max_records).values():
                tags, headers = cols.tags, cols.headers
                got += [
                    (cols.partition, o, k, v, tags[i], headers[i], t)
                    for i, (o, k, v, t) in enumerate(
                        zip(cols.offsets, cols.keys, cols.values, cols.timestamps, strict=True)
                    )
                ]
        else:
            got += map(row, c.poll(0.2, max_records))
    return got


def by_partition(rows: list[Row]) -> dict[int, list[Row]]:
    out: dict[int, list[Row]] = {}
    for r in rows:
        out.setdefault(r[0], []).append(r)
    return out


def test_poll_columns_returns_exactly_what_poll_would(cluster: Cluster) -> None:
    topic = cluster.topic(3, "cols")
    n = 900
    with cluster.client().producer(topic) as p:
        values, keys, headers, tags = records_of(n)
        p.send_many(values, keys, headers=headers, tags=tags).result(timeout=20)
    client = cluster.client()
    plain = client.consumer("cols-plain", [topic], auto_offset_reset="earliest", **FAST)
    cols = client.consumer("cols-cols", [topic], auto_offset_reset="earliest", **FAST)
    mixed = client.consumer("cols-mixed", [topic], auto_offset_reset="earliest", **FAST)
    expected = by_partition(poll_rows(plain, n, columns=False))
    assert sum(map(len, expected.values())) == n
    assert by_partition(poll_rows(cols, n, columns=True)) == expected
    # A consumer switching between the two, a few records at a time, gets the same records once each.
    got: list[Row] = []
    for i in range(n):
        if len(got) >= n:
            break
        got += poll_rows(mixed, 1, columns=i % 2 == 0, max_records=37)
    assert by_partition(got) == expected
    for c in (plain, cols, mixed):
        c.close()


def test_poll_columns_positions_and_commits_as_poll(cluster: Cluster) -> None:
    topic = cluster.topic(2, "cols-commit")
    with cluster.client().producer(topic, partitioner="round_robin") as p:
        p.send_many([b"%d" % i for i in range(40)]).result(timeout=10)
    client = cluster.client()
    c = client.consumer(
        "cols-commit", [topic], auto_offset_reset="earliest", enable_auto_commit=False, **FAST
    )
    got = poll_rows(c, 10, columns=True, max_records=10)
    assert len(got) == 10
    positions = {tp: c.position(tp) or 0 for tp in c.assignment()}
    assert sum(positions.values()) == 10
    # poll mode: commit() covers what poll_columns() returned.
    assert c.commit() == positions
    c.close()
    again = client.consumer("cols-commit", [topic], auto_offset_reset="earliest", **FAST)
    rest = poll_rows(again, 30, columns=True)
    assert sorted(r[3] for r in got + rest) == sorted(b"%d" % i for i in range(40))
    again.close()


def test_poll_columns_refuses_consumers_that_need_record_objects(cluster: Cluster) -> None:
    topic = cluster.topic(1, "cols-refused")
    client = cluster.client()
    refused: list[tuple[str, dict[str, Any]]] = [
        ("cols-ifm", {"commit_mode": "in-flight-min"}),
        ("cols-serde", {"value_deserializer": "str"}),
    ]
    for group, extra in refused:
        c = client.consumer(group, [topic], auto_offset_reset="earliest", **FAST, **extra)
        with pytest.raises(InvalidArgument, match="poll_columns"):
            c.poll_columns(0.1)
        c.close()


@dataclass
class ColumnMember:
    """A consumer polling columns in a thread of its own, recording every record it processes."""

    consumer: Consumer
    processed: list[tuple[int, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def start(self) -> ColumnMember:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                for cols in self.consumer.poll_columns(0.1).values():
                    self.processed += [(cols.partition, o) for o in cols.offsets]
            self.consumer.close()
        except BaseException as exc:
            self.error = exc
        finally:
            self.stop.set()


def test_a_rebalance_while_members_poll_columns_loses_and_repeats_nothing(cluster: Cluster) -> None:
    topic = cluster.topic(6, "cols-churn")
    cfg: dict[str, Any] = {
        "auto_offset_reset": "earliest",
        "session_timeout": "10s",
        "fetch_max_wait": "100ms",
    }
    halt = threading.Event()
    futures = []

    def produce() -> None:
        with cluster.client().producer(topic, linger="5ms") as p:
            i = 0
            while not halt.is_set():
                futures.append(
                    p.send_many([b"%d" % j for j in range(i, i + 40)], [b"%d" % j for j in range(i, i + 40)])
                )
                i += 40
                time.sleep(0.02)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    members = [ColumnMember(cluster.client().consumer("cols-churn", [topic], **cfg)).start()]
    time.sleep(1.0)
    members.append(ColumnMember(cluster.client().consumer("cols-churn", [topic], **cfg)).start())
    time.sleep(1.5)
    members[0].stop.set()  # leaves (commit, revoke) while the other keeps polling
    time.sleep(1.0)
    halt.set()
    writer.join(20)
    written = {(m.partition, m.offset) for f in futures for m in f.result(timeout=20)}
    deadline = time.monotonic() + 30
    while not written <= {p for m in members for p in m.processed}:
        assert time.monotonic() < deadline, "records never consumed"
        assert all(m.error is None for m in members), [m.error for m in members]
        time.sleep(0.1)
    members[1].stop.set()
    time.sleep(0.5)
    assert all(m.error is None for m in members), [m.error for m in members]
    counts = Counter(p for m in members for p in m.processed)
    assert set(counts) == written
    assert {p: k for p, k in counts.items() if k > 1} == {}
    assert all(m.processed for m in members), [len(m.processed) for m in members]


def test_send_many_keyless_records_linger_zero_and_callbacks(cluster: Cluster) -> None:
    topic = cluster.topic(4, "bulk-keyless")
    client = cluster.client()
    values = [b"%d" % i for i in range(100)]
    # Sticky (the default): a call's keyless records stay together on one partition.
    with client.producer(topic, linger=0) as p:
        metas = p.send_many(values).result(timeout=10)
        assert len({m.partition for m in metas}) == 1
        assert [m.offset for m in metas] == list(range(metas[0].offset, metas[0].offset + 100))
    # round_robin: they rotate record by record, as consecutive send() calls would.
    with client.producer(topic, partitioner="round_robin", linger=0) as p:
        metas = p.send_many(values).result(timeout=10)
        assert [m.partition for m in metas] == [(metas[0].partition + i) % 4 for i in range(100)]
        done: list[int] = []
        fut = p.send_many(values[:10], [b"a", b"b"] * 5)
        fut.add_done_callback(lambda f: done.append(len(f.result(0))))
        fut.result(timeout=10)
        deadline = time.monotonic() + 5
        while not done:
            assert time.monotonic() < deadline, "the callback never ran"
            time.sleep(0.01)
        assert done == [10]
        fut.add_done_callback(lambda f: done.append(-1))  # done already: runs at once
        assert done == [10, -1]
        assert all(not isinstance(r, SluiceError) for r in fut.results(0))
        assert p.send_many([]).result(timeout=1) == []
