"""Closing a fetcher while a pipelined fetch's answer is on its way logs nothing.

``sluice track`` (one record read with ``max_wait_ms=0``) and the Spark source's executors (one
offset range each) close their fetcher right after the answer they wanted, while the next fetch,
sent before that answer was decoded, is still being answered. That answer belongs to a request
``close()`` already failed: it used to pass for a broker breaking the protocol and log
``answer to request 2 arrived, expected none; reconnecting`` (about one close in fifteen here).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from sluice import Client
from sluice.cli.track import fetch_record
from sluice.spark.options import SourceOptions
from sluice.spark.planning import OffsetRange
from sluice.spark.reading import read_range
from tests.integration.client.conftest import Cluster

ROUNDS = 60


def _noise(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("sluice")
    ]


def _fill(client: Client, topic: str, n: int) -> None:
    with client.producer(topic) as p:
        for i in range(n):
            p.send(f"v{i}".encode(), tag="tagA" if i % 2 else "tagB", partition=0)


def test_the_track_path_closes_its_fetcher_quietly(
    client: Client, new_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(partitions=1)
    _fill(client, topic, ROUNDS)
    caplog.set_level(logging.INFO, logger="sluice")
    for offset in range(ROUNDS):
        record = fetch_record(client, topic, 0, offset)
        assert record.offset == offset
    assert _noise(caplog) == []


def test_the_spark_range_reader_closes_its_fetcher_quietly(
    cluster: Cluster, client: Client, new_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    topic = new_topic(partitions=1)
    _fill(client, topic, ROUNDS + 1)
    options = SourceOptions(
        cluster.bootstrap, (topic,), "earliest", "latest", "", None, None, True, None, request_timeout_s=10.0
    )
    caplog.set_level(logging.INFO, logger="sluice")
    for start in range(ROUNDS):
        rows = sum(b.num_rows for b in read_range(OffsetRange(topic, 0, start, start + 1), options))
        assert rows == 1
    assert _noise(caplog) == []
