"""docs/security.md's table of what each request needs is the guard table in code, rendered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_guard_table_in_the_docs_is_fresh() -> None:
    script = str(ROOT / "scripts" / "guard_table.py")
    check = subprocess.run([sys.executable, script, "--check"], check=False, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
