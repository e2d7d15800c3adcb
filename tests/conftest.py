"""Shared pytest setup: make the source root importable for in-process tests."""

from __future__ import annotations

import sys
from pathlib import Path

SERVICES = Path(__file__).resolve().parent.parent / "services"
if str(SERVICES) not in sys.path:
    sys.path.insert(0, str(SERVICES))

# Hypothesis's speed health check and per-example deadline measure the machine, not the code: on a shared
# 2-core CI host a load spike makes generation "slow" and an example "late" while the property holds. The
# properties are what the suite asserts; every test still runs its full number of examples.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("sluice", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sluice")
