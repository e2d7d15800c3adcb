"""Shared pytest setup: make the source root importable for in-process tests."""

from __future__ import annotations

import sys
from pathlib import Path

SERVICES = Path(__file__).resolve().parent.parent / "services"
if str(SERVICES) not in sys.path:
    sys.path.insert(0, str(SERVICES))
