"""Every service raises its soft open-files limit to the hard one at start-up and logs both."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

from sluice.cli.main import SERVICES
from tests.harness import ROOT, _env

_PROBE = """
import resource
from sluice.server.runtime import configure_logging
configure_logging("INFO")
print("limits", *resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def start_up(soft: int, hard: int) -> str:
    """Run the shared service start-up in a process started with (soft, hard); its output."""
    done = subprocess.run(
        ["prlimit", f"--nofile={soft}:{hard}", "--", sys.executable, "-c", _PROBE],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    return done.stdout + done.stderr


def test_start_up_raises_the_soft_limit_to_the_hard_one_and_logs_both() -> None:
    out = start_up(64, 4096)
    assert "limits 4096 4096" in out
    assert "open files limit: soft 64 raised to 4096 (the hard limit is 4096)" in out


def test_a_soft_limit_already_at_the_hard_one_is_logged_as_it_is() -> None:
    out = start_up(200, 200)
    assert "limits 200 200" in out
    assert "open files limit: soft 200, hard 200 (already at the hard limit)" in out


def test_every_service_main_goes_through_the_shared_start_up() -> None:
    # service_main calls configure_logging; the coordinator's main calls it directly.
    for service, module_name in SERVICES.items():
        source = inspect.getsource(importlib.import_module(module_name))
        assert "service_main(" in source or "configure_logging(" in source, service
