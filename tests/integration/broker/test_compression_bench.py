"""Smoke run of bench/compression.py with small numbers (issue 18: "the benchmark reports the size ratio and
the throughput for each codec"): it runs, in process and against a real coordinator and broker, and reports
both for every codec. Timing is the benchmark's business, not asserted here."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

from tests.harness import ROOT

CODECS = ["none", "gzip", "lz4", "zstd"]


def test_the_compression_bench_reports_ratio_and_throughput_per_codec() -> None:
    name = f"smoke-compression-{uuid.uuid4().hex[:8]}"
    result = ROOT / "bench" / "results" / f"{name}.json"
    argv = [sys.executable, "bench/compression.py", "--records", "400", "--rounds", "1", "--name", name]
    try:
        run = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=600, check=False)
        assert run.returncode == 0, run.stderr.decode()[-3000:]
        data = json.loads(result.read_text())
    finally:
        result.unlink(missing_ok=True)
    assert sorted(data["codec"]) == sorted(CODECS)
    assert sorted(data["e2e"]) == sorted(CODECS)
    assert data["codec"]["none"]["ratio"] == 1.0
    for codec in ("gzip", "lz4", "zstd"):
        assert data["codec"][codec]["ratio"] > 1.5, (codec, data["codec"][codec])  # JSON compresses
        assert data["e2e"][codec]["stored_log_bytes"] < data["e2e"]["none"]["stored_log_bytes"]
    for codec in CODECS:
        part = data["codec"][codec]
        assert part["encode_records_per_s"] > 0
        assert part["decode_records_per_s"] > 0
        assert part["sql_filter_10pct_records_per_s"] > 0
        e2e = data["e2e"][codec]
        assert e2e["produce_records_per_s"] > 0
        assert e2e["consume_records_per_s"] > 0
