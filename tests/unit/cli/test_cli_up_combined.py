"""``sluice up``'s combined mode: services as threads of one process, supervised as child processes are.

The real services run combined in tests/integration/cli/test_cli_system.py; here a stand-in service (this
module's ``main``) crashes on demand, which no real one does, to show that a crash stops the rest.
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import pytest

from sluice.cli.errors import CliError
from sluice.cli.supervisor import Supervisor
from sluice.cli.up import processes_mode
from sluice.cli.up_combined import ServiceThread
from sluice.server.embedded import current_host, say


def main(argv: list[str]) -> int:
    """The stand-in: its ready line, then it waits for its stop (exit 0) or, given ``crash``, raises."""
    host = current_host()
    assert host is not None
    say(f"SLUICE_READY service={argv[0]} address=127.0.0.1:1234 metrics=-")
    if argv[1:] == ["crash"]:
        raise RuntimeError("stand-in crash")
    stopped = threading.Event()
    host.on_stop(stopped.set)
    return 0 if stopped.wait(30) else 3


def standin(sup: Supervisor, tmp_path: Path, *argv: str) -> ServiceThread:
    return ServiceThread(argv[0], __name__, list(argv), tmp_path / f"{argv[0]}.log", sup.waker)


def test_a_crashed_service_is_reported_and_the_others_stop(sup: Supervisor, tmp_path: Path) -> None:
    healthy = standin(sup, tmp_path, "healthy")
    assert sup.start(healthy, 10) is not None
    crashing = standin(sup, tmp_path, "crashing", "crash")
    assert sup.start(crashing, 10) is not None
    # The crash ends the wait as a dead child process would (`sluice up` then stops all and exits 1).
    assert sup.wait() is crashing
    assert crashing.returncode == 1
    assert "RuntimeError: stand-in crash" in crashing.log_path.read_text()
    sup.stop_all()
    assert healthy.exited
    assert healthy.returncode == 0  # stopped by its request, not abandoned
    assert "SLUICE_READY service=healthy" in healthy.log_path.read_text()


def test_a_service_thread_cannot_be_restarted_alone(sup: Supervisor, tmp_path: Path) -> None:
    service = standin(sup, tmp_path, "one")
    assert sup.start(service, 10) is not None
    with pytest.raises(CliError, match="--processes separate"):
        service.restart()


@pytest.mark.parametrize(
    ("processes", "restart", "mode"),
    [(None, False, "combined"), (None, True, "separate"), ("separate", False, "separate")],
)
def test_processes_default_to_combined_and_to_separate_with_restart(
    processes: str | None, restart: bool, mode: str
) -> None:
    assert processes_mode(argparse.Namespace(processes=processes, restart=restart)) == mode


def test_restart_with_combined_processes_is_refused() -> None:
    with pytest.raises(CliError, match="--processes separate"):
        processes_mode(argparse.Namespace(processes="combined", restart=True))
