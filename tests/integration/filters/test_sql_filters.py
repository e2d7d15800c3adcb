"""SQL92 property filters end to end, on a real cluster (coordinator, broker, offset store, Redis).

- An SQL filter and a tag filter in one group under ``split`` each get exactly their records, and
  ``sluice track`` agrees with what each consumer got, record by record.
- The broker sends only matching records: counted in the raw fetch responses, before the SDK.
- ``sluice consume --filter-sql`` and bad expressions (typed error with the position, no traceback).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from sluice.cli.track import track
from sluice.codec.batch import decode_records, iter_headers
from sluice.codec.filter import sql_expression
from sluice.errors import InvalidFilter
from tests.integration.consumer.conftest import Cluster
from tests.integration.consumer.test_seed_004 import FAST, committed, drain, sluice

FILTERED = "CONSUMED_BUT_FILTERED"
SQL = "region = 'eu' AND prio >= 5"


def _produce(cluster: Cluster, topic: str, n: int) -> dict[tuple[int, int], dict[str, Any]]:
    """n records over the partitions: tags a/b alternating, headers region/prio/id. Returns
    {(partition, offset): {"tag", "headers", "value"}}."""
    sent: dict[tuple[int, int], dict[str, Any]] = {}
    with cluster.client().producer(topic, partitioner="round_robin") as p:
        futures = []
        for i in range(n):
            region = [b"eu", b"us", b"ap"][i % 3]
            headers = {"region": region, "prio": str(i % 10).encode(), "id": str(i).encode()}
            tag = "tagA" if i % 2 else "tagB"
            futures.append((p.send(f"v{i}".encode(), tag=tag, headers=headers), tag, headers))
        for f, tag, headers in futures:
            r = f.result()
            sent[(r.partition, r.offset)] = {"tag": tag, "headers": headers}
    return sent


def _sql_match(h: dict[str, bytes]) -> bool:
    return h["region"] == b"eu" and int(h["prio"]) >= 5


def test_sql_and_tag_filter_split_in_one_group_and_track_agrees(cluster: Cluster) -> None:
    group = "sql-split"
    topic = cluster.topic(2, "sqlsplit")
    configured = sluice(cluster, "group", "config", group, "--conflict-policy", "split")
    assert configured.returncode == 0, configured.stderr
    c_sql = cluster.client().consumer(group, {topic: sql_expression(SQL)}, **FAST)
    c_tag = cluster.client().consumer(group, {topic: "tagA"}, **FAST)
    drain([c_sql, c_tag], lambda: len(c_sql.assignment()) == 2 and len(c_tag.assignment()) == 2)
    sent = _produce(cluster, topic, 120)
    want_sql = {k for k, r in sent.items() if _sql_match(r["headers"])}
    want_tag = {k for k, r in sent.items() if r["tag"] == "tagA"}
    assert 0 < len(want_sql) < len(sent)
    ends = {p: max(o for (q, o) in sent if q == p) + 1 for p in (0, 1)}
    sql_track = next(iter(c_sql.tracks().values()))
    tag_track = next(iter(c_tag.tracks().values()))
    got = drain(
        [c_sql, c_tag],
        lambda: committed(cluster, group, sql_track) == ends and committed(cluster, group, tag_track) == ends,
        timeout=30,
    )
    for _ in range(5):  # anything more would show up now
        got[0] += c_sql.poll(0.05)
        got[1] += c_tag.poll(0.05)
    assert sorted((r.partition, r.offset) for r in got[0]) == sorted(want_sql)
    assert sorted((r.partition, r.offset) for r in got[1]) == sorted(want_tag)
    assert all(_sql_match(r.headers) for r in got[0])

    # Message track for every record on both tracks: CONSUMED exactly where the consumer got it.
    # In process (``sluice.cli.track.track``, what the command runs) for all of them, and through the
    # real command for a few, so the test stays short.
    sql_filter = sql_expression(SQL)
    client = cluster.client()
    for (p, o), rec in sorted(sent.items()):
        _, states = track(client, group, topic, p, o)
        by_filter = {t.filter: t.state for t in states}
        want = {
            sql_filter: "CONSUMED" if (p, o) in want_sql else FILTERED,
            "tagA": "CONSUMED" if (p, o) in want_tag else FILTERED,
        }
        assert by_filter == want, (p, o, rec)
    for p, o in [min(want_sql), min(set(sent) - want_sql)]:
        out = sluice(cluster, "track", topic, str(p), str(o), "--group", group, "--format", "json")
        assert out.returncode == 0, out.stderr
        states_cli = {t["filter"]: t["state"] for t in json.loads(out.stdout)["tracks"]}
        assert states_cli[sql_filter] == ("CONSUMED" if (p, o) in want_sql else FILTERED)
    c_sql.close()
    c_tag.close()


def test_the_broker_sends_only_matching_records(cluster: Cluster) -> None:
    """Counted in the fetch responses themselves (``fetch_raw``: the broker's batches as received)."""
    topic = cluster.topic(1, "sqlwire")
    sent = _produce(cluster, topic, 300)
    want = sorted(o for (_, o), r in sent.items() if _sql_match(r["headers"]))
    end = max(o for _, o in sent) + 1
    client = cluster.client()
    offsets: list[int] = []
    records_in_responses = 0
    with client.fetcher({(topic, 0): 0}, filters={topic: sql_expression(SQL)}, max_wait_ms=100) as fetcher:
        deadline = time.monotonic() + 30
        while fetcher.positions()[(topic, 0)] < end:
            assert time.monotonic() < deadline
            for chunk in fetcher.fetch_raw(1.0):
                for _, h in iter_headers(chunk.data):
                    records_in_responses += h.record_count
                offsets += [r.offset for r in decode_records(chunk.data, topic, 0, chunk.start)]
    assert records_in_responses == len(want)
    assert offsets == want
    # The same data unfiltered: every record travels.
    unfiltered = 0
    with client.fetcher({(topic, 0): 0}, max_wait_ms=100) as fetcher:
        deadline = time.monotonic() + 30
        while fetcher.positions()[(topic, 0)] < end:
            assert time.monotonic() < deadline
            for chunk in fetcher.fetch_raw(1.0):
                unfiltered += sum(h.record_count for _, h in iter_headers(chunk.data))
    assert unfiltered == len(sent)


def test_cli_consume_filter_sql_and_bad_expressions(cluster: Cluster) -> None:
    topic = cluster.topic(1, "sqlcli")
    sent = _produce(cluster, topic, 60)
    want = sorted(o for (_, o), r in sent.items() if _sql_match(r["headers"]))
    args = ["--from", "earliest", "--filter-sql", SQL, "--timeout", "2", "--format", "json"]
    out = sluice(cluster, "consume", topic, *args)
    assert out.returncode == 0, out.stderr
    got = [json.loads(line)["offset"] for line in out.stdout.splitlines() if line.strip()]
    assert got == want
    bad = sluice(cluster, "consume", topic, "--filter-sql", "prio > 'high'", "--timeout", "1")
    assert bad.returncode != 0
    assert "INVALID_FILTER" in bad.stderr
    assert "column 8" in bad.stderr
    assert "Traceback" not in bad.stderr
    both = sluice(cluster, "consume", topic, "--filter", "tagA", "--filter-sql", SQL, "--timeout", "1")
    assert both.returncode != 0
    assert "cannot be used together" in both.stderr
    # A consumer refuses a bad filter before any I/O, with the typed error.
    with pytest.raises(InvalidFilter, match="ends too early"):
        cluster.client().consumer("sql-bad", {topic: sql_expression("a = 1 AND")}, **FAST)


def test_a_filter_that_skips_a_backlog_to_the_end_answers_at_once(cluster: Cluster) -> None:
    """A filtered scan that skips every record up to the log end answers with the new position at once,
    not after the fetch's ``max_wait_ms`` (here 5 s, so the long-poll would be unmistakable): otherwise
    a filter matching nothing costs one full long-poll per fetch (docs/filters.md)."""
    topic = cluster.topic(1, "sqlskip")
    sent = _produce(cluster, topic, 200)
    end = max(o for _, o in sent) + 1
    client = cluster.client()
    with client.fetcher(
        {(topic, 0): 0}, filters={topic: sql_expression("region = 'nowhere'")}, max_wait_ms=5000
    ) as fetcher:
        started = time.monotonic()
        deadline = started + 30
        while fetcher.positions()[(topic, 0)] < end:
            assert time.monotonic() < deadline
            assert fetcher.fetch_raw(0.2) == []
        assert time.monotonic() - started < 2.5, "the skipped backlog waited for the long-poll"
