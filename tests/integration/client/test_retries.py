"""Retries: the broker restarts in the middle of a produce stream.

With the default acks and idempotence every acknowledged record must be readable
afterwards, once, at the offset its future reported, and per partition the
acknowledged records keep send order
(one run of batches in flight per partition, retried in order). The broker comes
back on a new port, so the producer must also refresh its metadata.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest

from sluice import Client
from sluice.client.producer import FutureRecordMetadata, Producer
from sluice.codec.batch import Record
from tests.integration.client.conftest import run_cluster


def stream(producer: Producer, stop: threading.Event, sent: list[tuple[bytes, FutureRecordMetadata]]) -> None:
    i = 0
    while not stop.is_set():
        value = b"%d" % i
        sent.append((value, producer.send(value, key=b"k%d" % (i % 16))))
        i += 1
        if i % 100 == 0:
            time.sleep(0.002)  # a steady stream rather than one burst


def wait_for_count(sent: list[tuple[bytes, FutureRecordMetadata]], n: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(sent) <= n:
        assert time.monotonic() < deadline, "the producer stream stalled"
        time.sleep(0.01)
    sent[n][1].result(timeout=timeout)


@pytest.mark.parametrize(("flush", "kill"), [("interval", False), ("always", True)])
def test_acknowledged_records_survive_a_broker_restart(flush: str, kill: bool) -> None:
    with run_cluster(flush=flush) as cluster, Client(cluster.bootstrap, request_timeout=10) as client:
        topic = f"retry-{flush}"
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
        sent: list[tuple[bytes, FutureRecordMetadata]] = []
        t = threading.Thread(target=stream, args=(producer, stop, sent), daemon=True)
        t.start()
        try:
            wait_for_count(sent, 1000)
            old_address = cluster.broker.address
            cluster.restart_broker(kill=kill)
            assert cluster.broker.address != old_address
            wait_for_count(sent, len(sent) + 1000, timeout=60)
        finally:
            stop.set()
            t.join(10)
        producer.flush(timeout=60)
        producer.close(timeout=10)

        acked = [(v, f.result(timeout=0)) for v, f in sent if f.exception(timeout=0) is None]
        failed = [f.exception(timeout=0) for _, f in sent if f.exception(timeout=0) is not None]
        assert failed == []
        assert len(acked) == len(sent) > 2000

        ends = client.list_offsets(topic, "latest")
        records: list[Record] = []
        with client.fetcher({(topic, p): 0 for p in range(2)}) as f:
            deadline = time.monotonic() + 30
            while sum(f.positions().values()) < sum(ends.values()) and time.monotonic() < deadline:
                records += f.fetch(timeout=1.0)
        stored = {(r.partition, r.offset): r.value for r in records}
        for value, meta in acked:
            assert stored.get((meta.partition, meta.offset)) == value
        # Per partition, acknowledged offsets increase in send order.
        last: dict[int, int] = defaultdict(lambda: -1)
        for _, meta in acked:
            assert meta.offset > last[meta.partition]
            last[meta.partition] = meta.offset
        # Idempotence (the default): a batch retried across the restart is in the log once. Every value
        # was sent once, so a value stored twice is a duplicate.
        values = [r.value for r in records]
        duplicates = len(values) - len(set(values))
        assert duplicates == 0, f"{duplicates} duplicate records"
        assert len(values) == len(sent)
