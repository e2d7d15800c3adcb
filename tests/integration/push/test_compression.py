"""Compression end to end through the SDK (docs/compression.md): a producer with ``compression=...``;
a fetcher (unfiltered and SQL-filtered by the broker), a group consumer (tag-filtered by the broker) and
a push consumer (the dispatcher inflates and cuts, with a filter) read back every field."""

from __future__ import annotations

import time
import uuid

import pytest

from sluice import Client
from sluice.codec.filter import sql_expression
from tests.integration.push.helpers import drain, nothing_more

N = 60


def sent(i: int) -> tuple[bytes, bytes | None, str | None, dict[str, bytes], int]:
    value = b'{"order": %d, "status": "%s", "lines": ["sku-1", "sku-2"]}' % (i, (b"paid", b"shipped")[i % 2])
    return (
        value,
        (b"k%d" % i if i % 5 else None),
        ("a", "b", None)[i % 3],
        {"region": b"r%d" % (i % 4)},
        10_000 + i,
    )


def fields(r: object) -> tuple[bytes, bytes | None, str | None, dict[str, bytes], int]:
    return r.value, r.key, r.tag, r.headers, r.timestamp  # type: ignore[attr-defined]


@pytest.mark.parametrize("codec", ["zstd", "lz4", "gzip"])
def test_every_consumer_reads_compressed_batches(client: Client, codec: str) -> None:
    topic = f"cz-{codec}-{uuid.uuid4().hex[:6]}"
    client.admin.create_topic(topic, partitions=1)
    with client.producer(topic, compression=codec, linger="50ms") as producer:
        for f in [
            producer.send(v, key=k, tag=t, headers=h, timestamp=ts) for v, k, t, h, ts in map(sent, range(N))
        ]:
            f.result()
    expected = [sent(i) for i in range(N)]

    fetcher = client.fetcher({(topic, 0): 0})
    raw = fetcher_records(fetcher, topic, N)
    assert [fields(r) for r in raw] == expected
    fetcher.close()
    sql = client.fetcher({(topic, 0): 0}, filters={topic: sql_expression("region = 'r1'")})
    got = fetcher_records(sql, topic, N)
    assert [fields(r) for r in got] == [e for i, e in enumerate(expected) if i % 4 == 1]
    sql.close()

    with client.consumer(f"g-{codec}", {topic: "b"}, auto_offset_reset="earliest") as consumer:
        polled: list[object] = []
        deadline = time.monotonic() + 20
        while len(polled) < N // 3 and time.monotonic() < deadline:
            polled += consumer.poll(0.5)
        assert [fields(r) for r in polled] == [e for i, e in enumerate(expected) if i % 3 == 1]
        consumer.commit()

    with client.push_consumer(topic, f"s-{codec}", initial_position="earliest", filter="a") as pc:
        msgs = drain(pc, N // 3)
        assert [fields(m) for m in msgs] == [e for i, e in enumerate(expected) if i % 3 == 0]
        assert nothing_more(pc)


def fetcher_records(fetcher: object, topic: str, end: int) -> list[object]:
    out: list[object] = []
    deadline = time.monotonic() + 20
    while fetcher.positions()[(topic, 0)] < end and time.monotonic() < deadline:  # type: ignore[attr-defined]
        out += fetcher.fetch(0.5)  # type: ignore[attr-defined]
    return out
