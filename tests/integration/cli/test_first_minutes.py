"""What a new user trips over in the first minutes (issue 18), against a real ``sluice up``: a wrong
bootstrap address fails at once and says what to check; another service's port as the bootstrap says
which service it is; ``sluice up`` refuses a metrics port that lands on a service port, and a port
already taken ends ``sluice up`` with the typed error and no traceback in any log."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import ROOT, _env
from tests.integration.cli.test_cli_system import Up, start_up

ADDRESS = re.compile(r"^\s+(\S+)\s+(\d+\.\d+\.\d+\.\d+:\d+)\s")


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    stack = start_up(tmp_path_factory.mktemp("first-minutes") / "data")
    try:
        yield stack
    finally:
        stack.stop()


def cli(bootstrap: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sluice", "--bootstrap", bootstrap, *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT, check=False
    )


def addresses(up: Up) -> dict[str, str]:
    return {m.group(1): m.group(2) for line in up.stdout if (m := ADDRESS.match(line))}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_refused_bootstrap_fails_at_once_naming_the_address() -> None:
    address = f"127.0.0.1:{closed_port()}"
    started = time.monotonic()
    result = cli(address, "topic", "list")
    assert result.returncode == 1
    assert time.monotonic() - started < 15  # not the 30 s request timeout
    assert f"cannot reach the coordinator at {address}: connection refused" in result.stderr
    assert "--bootstrap" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unresolvable_bootstrap_host_is_named() -> None:
    result = cli("no-such-host.invalid:7600", "topic", "list")
    assert result.returncode == 1
    assert "cannot resolve the host" in result.stderr


def test_another_services_port_as_bootstrap_names_that_service(up: Up) -> None:
    assert cli(up.bootstrap, "topic", "list").returncode == 0
    served = addresses(up)
    for service, words in (("broker", "a broker's port"), ("dispatcher", "a dispatcher's port")):
        result = cli(served[service], "topic", "list")
        assert result.returncode == 1, result.stderr
        assert f"{served[service]} is {words}, not the coordinator's" in result.stderr
        assert "UNIMPLEMENTED" not in result.stderr


def test_up_refuses_a_metrics_port_on_a_wire_port(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "sluice", "up", "--data-dir", str(tmp_path / "d"), "--port", "7600"]
    result = subprocess.run(
        [*command, "--metrics-port", "7611"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
        check=False,
    )
    assert result.returncode == 1
    assert "metrics port 7611 is also a gRPC or wire port" in result.stderr
    assert not (tmp_path / "d" / "logs").exists()  # refused before anything started


def test_up_with_its_coordinator_port_taken_fails_typed_without_a_traceback(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        data = tmp_path / "d"
        command = [sys.executable, "-m", "sluice", "up", "--data-dir", str(data), "--port", str(port)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=90, env=_env(), check=False)
    assert result.returncode != 0
    assert "could not bind" in result.stderr
    assert "Traceback" not in result.stderr
    for log in (data / "logs").glob("*.log"):
        assert "Traceback" not in log.read_text(), log.name


def test_up_runs_the_scheduler_so_a_delayed_send_arrives_when_due(up: Up) -> None:
    """`sluice up` starts the delayed-delivery scheduler with the rest (docs/delayed-delivery.md): a
    record sent with --deliver-after is not readable before it is due, and is once it is."""
    assert "scheduler" in "\n".join(up.stdout)
    assert cli(up.bootstrap, "topic", "create", "later", "--partitions", "1").returncode == 0
    sent = time.time()
    command = [sys.executable, "-m", "sluice", "--bootstrap", up.bootstrap, "produce", "later"]
    produced = subprocess.run(
        [*command, "--deliver-after", "2s"],
        input="due\n", capture_output=True, text=True, timeout=60, env=_env(), cwd=ROOT, check=False,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    got = cli(up.bootstrap, "consume", "later", "--from", "earliest", "--max", "1", "--format", "json")
    assert got.returncode == 0, got.stderr
    # The consume follows the topic from the start: it can only return once the record was appended.
    assert time.time() >= sent + 2, "the record was readable before it was due"
    record = json.loads(got.stdout)
    assert record["value"] == "due"
    assert int(record["headers"]["sluice-deliver-at"]) >= sent * 1000 + 2000 - 50
