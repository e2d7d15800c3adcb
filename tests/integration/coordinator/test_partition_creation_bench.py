"""Smoke run of bench/partition_creation.py with small numbers: it runs, fills, measures and counts right.
Timing is the benchmark's business, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from tests.harness import ROOT


def test_the_partition_creation_bench_runs_and_counts_right() -> None:
    name = f"smoke-partition-creation-{uuid.uuid4().hex[:8]}"
    result = ROOT / "bench" / "results" / f"{name}.json"
    argv = [sys.executable, "bench/partition_creation.py", "--levels", "0,120", "--topics", "2"]
    argv += ["--partitions", "20", "--rounds", "2", "--name", name]
    try:
        run = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=600, check=False)
        assert run.returncode == 0, run.stderr.decode()[-3000:]
        data = json.loads(result.read_text())
    finally:
        result.unlink(missing_ok=True)
    levels = data["levels"]
    assert [(lv["existing"], lv["created"]) for lv in levels] == [(0, 40), (120, 40)]
    # After each measurement the coordinator lists exactly what was created (fills included).
    # After each round the coordinator lists exactly what exists: the fills, the warm-up topics (1 partition
    # per level) and the round's topics (the earlier rounds' were deleted again).
    assert [lv["listed"] for lv in levels] == [1 + 40, 120 + 1 + 40]
    assert all(lv["seconds"] > 0 for lv in levels)
