"""``sluice user add|delete|list`` as a user runs it (a subprocess), against a real coordinator; the
passwords it sets log in with ScramLogin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sluice.errors import AuthenticationError
from sluice.security.scram_login import ScramLogin
from tests.harness import ROOT, _env
from tests.integration.auth.conftest import Coordinator
from tests.integration.auth.test_scram_login import login_error


def sluice(coordinator: Coordinator, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice", "--bootstrap", coordinator.address, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        cwd=ROOT,
        check=False,
    )


def logs_in(coordinator: Coordinator, user: str, password: str) -> bool:
    login = ScramLogin(coordinator.address, user, password)
    try:
        return coordinator.tokens().verify(login()) is not None
    finally:
        login.close()


def test_add_list_change_delete(coordinator: Coordinator, tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-a-file\n")
    added = sluice(
        coordinator, "user", "add", "cli-user", "--password-file", str(secret), "--iterations", "4096"
    )
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("Created user cli-user (generation 1)")
    assert logs_in(coordinator, "cli-user", "from-a-file")

    listed = sluice(coordinator, "user", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    docs = {d["name"]: d for d in map(json.loads, listed.stdout.splitlines())}
    assert docs["cli-user"] == {
        "name": "cli-user",
        "mechanism": "SCRAM-SHA-256",
        "iterations": 4096,
        "generation": 1,
    }
    assert "cli-user" in sluice(coordinator, "user", "list").stdout

    changed = sluice(coordinator, "user", "add", "cli-user", "--iterations", "4096", stdin="from-stdin\n")
    assert changed.returncode == 0, changed.stderr
    assert changed.stdout.startswith("Changed the password of user cli-user (generation 2)")
    assert logs_in(coordinator, "cli-user", "from-stdin")
    assert isinstance(login_error(coordinator.address, "cli-user", "from-a-file"), AuthenticationError)

    deleted = sluice(coordinator, "user", "delete", "cli-user")
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.startswith("Deleted user cli-user (generation 3)")
    again = sluice(coordinator, "user", "delete", "cli-user")
    assert again.returncode == 1
    assert again.stderr.startswith("error: UNKNOWN_USER: no user named 'cli-user'")


def test_bad_input_is_a_clear_error(coordinator: Coordinator, tmp_path: Path) -> None:
    bad_name = sluice(coordinator, "user", "add", "no spaces", stdin="pw\n")
    assert bad_name.returncode == 1
    assert bad_name.stderr.startswith("error: INVALID_ARGUMENT: invalid user name")
    few = sluice(coordinator, "user", "add", "cli-few", "--iterations", "100", stdin="pw\n")
    assert few.returncode == 1
    assert "iterations must be 4096-1000000" in few.stderr
    empty = sluice(coordinator, "user", "add", "cli-empty", stdin="\n")
    assert empty.returncode == 2
    assert "the password is empty" in empty.stderr
    missing = sluice(coordinator, "user", "add", "cli-x", "--password-file", str(tmp_path / "absent"))
    assert missing.returncode == 2
    assert "cannot read --password-file" in missing.stderr
    for result in (bad_name, few, empty, missing):
        assert "Traceback" not in result.stderr
    # There is no flag that takes the password itself.
    flag = sluice(coordinator, "user", "add", "cli-y", "--password", "hunter2")
    assert flag.returncode == 2
    assert "there is no --password flag" in flag.stderr
    assert "hunter2" not in flag.stderr  # refused without echoing it
