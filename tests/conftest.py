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
import os  # noqa: E402

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("sluice", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The long campaign (bench/fuzz/run.py): the same properties, many more examples each. Properties that
# fix their own ``max_examples`` keep it; the ones under tests/unit/fuzz leave it to the profile.
settings.register_profile(
    "fuzz",
    parent=settings.get_profile("sluice"),
    max_examples=int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "20000")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("SLUICE_HYPOTHESIS_PROFILE", "sluice"))
