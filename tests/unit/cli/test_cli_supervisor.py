"""The process supervisor of ``sluice up``, driven with small real child processes."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from sluice.cli.errors import CliError
from sluice.cli.supervisor import SERVICE_READY, Child, Supervisor

# A stand-in service: prints the ready line, records SIGTERM in a file, exits.
SERVICE = """
import signal, sys, time
name, record, ignore_term = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
def on_term(*_):
    with open(record, "a") as f:
        f.write(name + "\\n")
    if not ignore_term:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print(f"starting {name}", flush=True)
print(f"SLUICE_READY service={name} address=127.0.0.1:1234 metrics=127.0.0.1:5678", flush=True)
while True:
    time.sleep(60)
"""


def service(sup: Supervisor, tmp_path: Path, name: str, ignore_term: bool = False) -> Child:
    argv = [sys.executable, "-c", SERVICE, name, str(tmp_path / "terms"), "1" if ignore_term else "0"]
    return Child(name, argv, tmp_path / "logs" / f"{name}.log", SERVICE_READY, sup.waker)


def script(sup: Supervisor, tmp_path: Path, name: str, code: str) -> Child:
    return Child(name, [sys.executable, "-c", code], tmp_path / f"{name}.log", SERVICE_READY, sup.waker)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_ready_line_is_parsed_and_output_logged(sup: Supervisor, tmp_path: Path) -> None:
    child = service(sup, tmp_path, "alpha")
    ready = sup.start(child, timeout=20)
    assert ready is not None
    assert ready.group("address") == "127.0.0.1:1234"
    assert ready.group("metrics") == "127.0.0.1:5678"
    log = (tmp_path / "logs" / "alpha.log").read_text()
    assert "sluice up starts:" in log
    assert "starting alpha" in log


def test_children_stop_in_reverse_start_order(sup: Supervisor, tmp_path: Path) -> None:
    children = [service(sup, tmp_path, name) for name in ("first", "second", "third")]
    for child in children:
        sup.start(child, timeout=20)
    sup.stop_all()
    assert (tmp_path / "terms").read_text().split() == ["third", "second", "first"]
    assert all(c.exited and c.returncode == 0 and gone(c.pid) for c in children)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    sup = Supervisor(grace=0.5)
    child = service(sup, tmp_path, "stubborn", ignore_term=True)
    sup.start(child, timeout=20)
    started = time.monotonic()
    sup.stop_all()
    sup.waker.close()
    assert 0.4 < time.monotonic() - started < 10
    assert child.returncode == -signal.SIGKILL
    assert (tmp_path / "terms").read_text().split() == ["stubborn"]


def test_a_child_that_dies_before_ready_is_reported_with_its_last_lines(
    sup: Supervisor, tmp_path: Path
) -> None:
    child = script(sup, tmp_path, "broken", "import sys; print('bind failed: port in use'); sys.exit(3)")
    with pytest.raises(CliError) as exc:
        sup.start(child, timeout=20)
    assert exc.value.code_name == "STARTUP_FAILED"
    assert "broken exited with code 3 before it was ready" in exc.value.message
    assert "bind failed: port in use" in exc.value.message


def test_a_child_that_never_gets_ready_times_out(sup: Supervisor, tmp_path: Path) -> None:
    child = script(sup, tmp_path, "slow", "import time; print('warming up', flush=True); time.sleep(60)")
    with pytest.raises(CliError, match=r"slow was not ready after 0.3s") as exc:
        sup.start(child, timeout=0.3)
    assert "warming up" in exc.value.message
    sup.stop_all()
    assert child.exited
    assert gone(child.pid)


def test_wait_returns_the_child_that_died(sup: Supervisor, tmp_path: Path) -> None:
    steady = service(sup, tmp_path, "steady")
    sup.start(steady, timeout=20)
    flaky = script(
        sup,
        tmp_path,
        "flaky",
        "import sys, time; print('SLUICE_READY service=f address=a:1 metrics=-', flush=True);"
        "time.sleep(0.2); print('fatal: disk full', flush=True); sys.exit(1)",
    )
    sup.start(flaky, timeout=20)
    died = sup.wait()
    assert died is flaky
    assert died.returncode == 1
    assert "fatal: disk full" in died.last_lines()
    assert not steady.exited


def test_sigterm_to_the_supervisor_ends_wait(tmp_path: Path) -> None:
    sup = Supervisor(grace=5.0)
    sup.install_signal_handlers()
    try:
        child = service(sup, tmp_path, "svc")
        sup.start(child, timeout=20)
        os.kill(os.getpid(), signal.SIGTERM)
        assert sup.wait() is None
        assert sup.signals == [signal.SIGTERM]
        sup.stop_all()
        assert child.exited
    finally:
        sup.close()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_later_second_signal_skips_the_grace_period(tmp_path: Path) -> None:
    sup = Supervisor(grace=30.0)
    sup.install_signal_handlers()
    try:
        child = service(sup, tmp_path, "stubborn", ignore_term=True)
        sup.start(child, timeout=20)
        os.kill(os.getpid(), signal.SIGTERM)
        assert sup.wait() is None
        threading.Timer(1.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        started = time.monotonic()
        sup.stop_all()
        assert time.monotonic() - started < 10
        assert child.returncode == -signal.SIGKILL
    finally:
        sup.close()


def test_a_signal_sent_twice_at_once_is_one_request(tmp_path: Path) -> None:
    # timeout(1) and process managers signal the process and its group at the same time.
    sup = Supervisor(grace=1.5)
    sup.install_signal_handlers()
    try:
        child = service(sup, tmp_path, "stubborn", ignore_term=True)
        sup.start(child, timeout=20)
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        assert sup.wait() is None
        started = time.monotonic()
        sup.stop_all()
        assert time.monotonic() - started >= 1.4  # the grace period was honoured
    finally:
        sup.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
