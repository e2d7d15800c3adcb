"""The committed generated code must equal what `make protos` produces now."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--out", tmp],
            check=True,
            capture_output=True,
        )
        fresh_dir = Path(tmp) / "sluice" / "v1"
        committed_dir = ROOT / "services" / "sluice" / "v1"
        fresh = {p.name: p.read_bytes() for p in fresh_dir.iterdir() if p.is_file()}
        committed = {p.name: p.read_bytes() for p in committed_dir.iterdir() if p.is_file()}
        assert sorted(fresh) == sorted(committed), "generated file set differs: run `make protos`"
        stale = [name for name in fresh if fresh[name] != committed[name]]
        assert not stale, f"stale generated code {stale}: run `make protos`"
