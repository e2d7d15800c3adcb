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

import pytest  # noqa: E402
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


# --- Parallel runs (`make test` runs pytest-xdist with `--dist loadfile`; docs/testing.md, "Test-suite
# budget"). This is the one place that says which tests may run beside which. A test file is the unit of
# work: its module-scoped cluster is started once, on one worker (a package-scoped cluster is started once
# per worker that runs one of its files: tests use their own topics, so that is safe, only a few seconds
# of start-up). The exceptions are whole directories, each one unit run by one worker, file after file:
#: Directories whose tests run one after another on one worker, never beside each other, with the reason.
SERIAL_GROUPS: dict[str, tuple[str, ...]] = {
    # One SparkSession (a JVM) and one stack serve the whole package (package-scoped fixtures): split over
    # workers, each would start its own JVM, the heaviest start-up of the suite.
    "spark": ("tests/integration/spark/",),
    # Tests that measure time against the machine: chaos kills and outages timed against session and commit
    # timeouts, quota tests asserting rates within 10 %, the poison test's throughput ratios, the compare
    # smoke's own servers and clients, the dispatcher memory budget's rate with and without a hostile
    # consumer. Beside each other they would load the same 2 cores they measure.
    "timed": (
        "tests/chaos/",
        "tests/integration/quota/",
        "tests/integration/poison/",
        "tests/bench_compare/",
        "tests/integration/dispatcher/test_memory_budget.py",
    ),
}


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its serial group, else its file."""
    for group, prefixes in SERIAL_GROUPS.items():
        if nodeid.startswith(prefixes):
            return group
    return nodeid.split("::", 1)[0]


# xdist's own `--dist loadgroup` (xdist_group marks) does nothing under pytest 9: it renames the items'
# `_nodeid`, which pytest 9 no longer reads, and silently spreads a group's tests over every worker. A
# scheduler of our own groups by `work_unit` instead. optionalhook: a run without xdist (tests/packaging's
# slim venv) has no such hook.
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    scheduler = LoadFileScheduling(config, log)
    scheduler._split_scope = work_unit  # the file scheduler, with our units instead of files
    return scheduler


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Only on an xdist worker (whose collection order is the order work is handed out in): a plain run
    # keeps its order.
    if not hasattr(config, "workerinput"):
        return
    # The serial groups are the longest chains of the run: they go first (the Makefile keeps this order
    # with --no-loadscope-reorder) so the other workers share the rest around them, not after them.
    rank = {group: i for i, group in enumerate(SERIAL_GROUPS)}
    items.sort(key=lambda item: rank.get(work_unit(item.nodeid), len(rank)))
