"""Smoke test of bench/scale_partitions.py: the whole path (soft limit lowered below the partition
count, create, produce, fetch, restart, figures) on 200 partitions under a soft limit of 64."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.harness import ROOT, _env


def test_scale_partitions_bench_runs_under_a_soft_limit_below_the_partition_count() -> None:
    done = subprocess.run(
        [
            sys.executable, str(ROOT / "bench" / "scale_partitions.py"),
            "--partitions", "200", "--chunk", "100", "--soft-limit", "64", "--idle", "0.5", "--no-save",
        ],
        check=False, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for figures in (result["loaded"], result["restarted"]):
        assert figures["soft_limit"] > 64  # the broker raised it
        assert figures["open_fds"] <= 200 + 40  # one per partition plus a constant
    assert [c["existing"] for c in result["creation_seconds_per_chunk"]] == [0, 100]
