"""The comparison harness (bench/compare, issue 19) end to end, and its completeness check.

The smoke runs ``python -m compare --quick`` (what ``make compare QUICK=1`` runs) as a process, with
fewer records and one peer beside Sluice so it fits the suite's budget on a loaded 2-core machine: its
own servers start and stop, both clients run at the same time, and the JSON, the table, the four PNGs
and benchmarks.md are written. The broken adapters prove a lost or duplicated record fails the run.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compare import report, runner, servers
from compare.workload import Feed, Sink, value_at
from tests.bench_compare.broken_adapters import VICTIM, DroppingRedis, DuplicatingRedis

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_quick_compare_runs_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    argv = [
        sys.executable, "-m", "compare", "--quick", "--systems", "redis", "sluice-pull-4p-interval",
        "--records", "2000", "--latency-seconds", "1", "--curve-rates", "5000",
        "--json", str(out), "--docs", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=BENCH, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [s["name"] for s in data["systems"]] == ["redis", "sluice-pull-4p-interval"]
    for s in data["systems"]:
        assert not s["failed"], s
        assert s["version"].startswith(("Redis ", "Sluice ")), s["version"]
        assert s["peak_rss_mb"] > 1
        runs = [*s["throughput"], s["latency"], *s["curve"]]
        assert [(r["status"], r["missing"], r["duplicates"]) for r in runs] == [("OK", 0, 0)] * len(runs)
        assert s["throughput"][0]["distinct"] == 2000
        assert s["consume_rps"]["median"] > 0
        assert s["latency"]["e2e_ms"]["p99"] > 0
    sluice = data["systems"][1]["rss_by_process"]
    assert any(name.startswith("sluice up") for name in sluice)  # the combined process: every service
    assert any("redis-server" in name for name in sluice)
    for name in ("throughput", "latency_cdf", "latency_curve", "memory"):
        png = tmp_path / "benchmarks" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    doc = (tmp_path / "benchmarks.md").read_text()
    for part in ("QUICK run", "## Tail latency", "(latency.md)", "## Versions"):
        assert part in doc
    assert "| Redis Streams [no persistence (memory only)] | Sluice pull, 4 partitions" in doc


@pytest.mark.parametrize(
    ("broken", "what"), [(DroppingRedis, "1 missing"), (DuplicatingRedis, "1 duplicates")]
)
def test_a_broken_adapter_fails_the_run(broken: type, what: str) -> None:
    adapter = broken("broken", "Broken Redis", "none", "redis-none", pair="sluice-pull-4p-interval")
    plan = runner.Plan(records=300, reps=1, latency_rate=200, latency_seconds=0.5, curve_rates=())
    result = runner.run_system(adapter, plan, servers.Ports())
    assert result.failed
    for run in (result.throughput[0], result.latency):
        assert run["status"] == "FAILED", run
        assert what in run["reason"], run
    if broken is DroppingRedis:
        assert result.throughput[0]["missing"] == 1
        assert f"first: [{VICTIM}]" in result.throughput[0]["reason"]
    data = {"plan": dataclasses.asdict(plan), "systems": [runner.as_dict(result)]}
    assert "**FAILED**" in report.table(data)


def test_sink_counts_keys_not_records() -> None:
    """Receiving n records is not enough: a duplicate in place of a lost record is still a failure."""

    class Done:
        def is_set(self) -> bool:
            return True

    feed = Feed(4)
    records = feed.batch(10)
    sink = Sink(4, Done())
    for key, value in [records[0], records[1], records[1], records[3], (b"not-a-key", records[2][1])]:
        sink.add(key, value)
    assert (sink.received, sink.distinct, sink.duplicates, sink.unexpected) == (5, 3, 1, 1)
    assert sink.missing() == 1
    assert sink.first_missing() == [2]


def test_sink_add_many_counts_what_add_counts() -> None:
    """The vectorised ``add_many`` (every adapter that receives batches uses it) against ``add`` record by
    record: the same received, distinct, duplicate, unexpected and missing counts, and one latency per
    timed record, whatever a batch holds (a duplicate inside it or across batches, a stranger key, a
    warm-up value, a value of another size, a missing record)."""

    class Done:
        def is_set(self) -> bool:
            return True

    feed = Feed(50, warmup_seconds=0.0)
    keys, values = feed.columns(50)
    warm = value_at(0.0, warmup=True)
    batches = [
        (keys[:10], values[:10]),
        (keys[10:20] + keys[15:16], values[10:20] + values[15:16]),  # a duplicate inside the batch
        (keys[5:8], values[5:8]),  # duplicates of an earlier batch
        ([*keys[20:30], b"k%015d" % 999], [*values[20:30], values[0]]),  # a key out of range
        (keys[30:40], [warm] * 10),  # warm-up values: delivered and counted, not timed
        ([*keys[40:45], b"nonsense"], [*values[40:45], values[0]]),
        (keys[45:48], [*values[45:47], values[47] + b"+"]),  # a value of another size
        # keys[48:50]: never delivered
    ]
    one, many = Sink(50, Done()), Sink(50, Done())
    for ks, vs in batches:
        for k, v in zip(ks, vs, strict=True):
            one.add(k, v)
        many.add_many(ks, vs)
    counts = ("received", "distinct", "duplicates", "unexpected")
    assert [getattr(many, c) for c in counts] == [getattr(one, c) for c in counts]
    assert (many.missing(), many.first_missing()) == (one.missing(), one.first_missing()) == (2, [48, 49])
    assert len(many.latencies) == len(one.latencies)
    assert many.seen == one.seen


def test_an_unpaced_feed_stops_at_its_time_cap_and_expects_what_it_handed_out() -> None:
    """A throughput run of a slow system ends after ``max_seconds``; the consumer then expects exactly the
    records handed out, so a capped run is still checked for completeness."""
    feed = Feed(10**9, max_seconds=0.2)
    handed = 0
    deadline = time.monotonic() + 10
    while not feed.done:
        assert time.monotonic() < deadline, "the cap did not stop the feed"
        handed += len(feed.columns(1000)[0])
        time.sleep(0.01)
    assert 0 < handed == feed.next_index == feed.n < 10**9
