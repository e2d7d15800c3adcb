"""bench/ on sys.path: the harness is the ``compare`` package there (the spawned clients inherit it)."""

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
