"""``send_many`` across a broker restart: with idempotence (the default) every record of every call is
in the log once, at the offset its call's future reported, in the calls' order per partition."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from sluice import Client
from sluice.client.producer import FutureRecordsMetadata, Producer
from sluice.codec.batch import Record
from tests.integration.client.conftest import run_cluster

CALL = 50


def stream(
    producer: Producer, stop: threading.Event, sent: list[tuple[list[bytes], FutureRecordsMetadata]]
) -> None:
    i = 0
    while not stop.is_set():
        values = [b"%d" % j for j in range(i, i + CALL)]
        keys = [b"k%d" % (j % 16) for j in range(i, i + CALL)]
        sent.append((values, producer.send_many(values, keys)))
        i += CALL
        time.sleep(0.005)  # a steady stream rather than one burst


def wait_for_calls(
    sent: list[tuple[list[bytes], FutureRecordsMetadata]], n: int, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while len(sent) <= n:
        assert time.monotonic() < deadline, "the producer stream stalled"
        time.sleep(0.01)
    sent[n][1].result(timeout=timeout)


def test_send_many_records_survive_a_broker_kill_once_each_and_in_order() -> None:
    with run_cluster(flush="always") as cluster, Client(cluster.bootstrap, request_timeout=10) as client:
        topic = "bulk-retry"
        client.admin.create_topic(topic, partitions=2)
        producer = client.producer(
            topic,
            linger="2ms",
            retries=100,
            retry_backoff_max="500ms",
            delivery_timeout="60s",
            request_timeout="5s",
        )
        stop = threading.Event()
        sent: list[tuple[list[bytes], FutureRecordsMetadata]] = []
        t = threading.Thread(target=stream, args=(producer, stop, sent), daemon=True)
        t.start()
        try:
            wait_for_calls(sent, 20)
            cluster.restart_broker(kill=True)
            wait_for_calls(sent, len(sent) + 20)
        finally:
            stop.set()
            t.join(10)
        producer.flush(timeout=60)
        producer.close(timeout=10)

        assert [f.exception(timeout=0) for _, f in sent if f.exception(timeout=0) is not None] == []
        acked = [(v, m) for values, f in sent for v, m in zip(values, f.result(timeout=0), strict=True)]
        assert len(acked) == CALL * len(sent) > 40 * CALL

        ends = client.list_offsets(topic, "latest")
        records: list[Record] = []
        with client.fetcher({(topic, p): 0 for p in range(2)}) as f:
            deadline = time.monotonic() + 30
            while sum(f.positions().values()) < sum(ends.values()) and time.monotonic() < deadline:
                records += f.fetch(timeout=1.0)
        stored = {(r.partition, r.offset): r.value for r in records}
        for value, meta in acked:
            assert stored.get((meta.partition, meta.offset)) == value
        last: dict[int, int] = defaultdict(lambda: -1)
        for _, meta in acked:
            assert meta.offset > last[meta.partition]
            last[meta.partition] = meta.offset
        values = [r.value for r in records]
        assert len(values) == len(set(values)) == len(acked), (
            "a batch retried across the kill is in the log once"
        )
