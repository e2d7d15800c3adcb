"""docs/architecture.md lists every module of services/sluice with its role, as the code says it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_module_map_names_every_module_and_is_fresh() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    package = ROOT / "services" / "sluice"
    for path in package.rglob("*.py"):
        if (package / "v1") in path.parents:
            continue
        rel = path.relative_to(package.parent).as_posix()
        assert f"`{rel}`" in doc, f"docs/architecture.md does not list {rel}: run `make module-map`"
    script = str(ROOT / "scripts" / "module_map.py")
    check = subprocess.run([sys.executable, script, "--check"], check=False, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
