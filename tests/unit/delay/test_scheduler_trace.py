"""The scheduler's own timeline (``broker/schedule/trace.py``): off by default, JSON lines when asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.broker.schedule import trace as trace_mod


def test_trace_writes_one_json_line_per_event_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trace_mod, "_opened", False)
    monkeypatch.setattr(trace_mod, "_file", None)
    monkeypatch.delenv(trace_mod.TRACE_ENV, raising=False)
    trace_mod.trace("batch", n=1)  # off: nothing anywhere
    assert trace_mod._file is None
    path = tmp_path / "t.jsonl"
    monkeypatch.setattr(trace_mod, "_opened", False)
    monkeypatch.setenv(trace_mod.TRACE_ENV, str(path))
    trace_mod.trace("batch", n=3, first_due=10)
    trace_mod.trace("load_end", bucket=7, records=2)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(e["kind"], e.get("n"), e.get("bucket")) for e in lines] == [
        ("batch", 3, None),
        ("load_end", None, 7),
    ]
    assert all(isinstance(e["at"], int) for e in lines)
    assert trace_mod._file is not None
    trace_mod._file.close()
