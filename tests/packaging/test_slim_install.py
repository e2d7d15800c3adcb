"""``pip install sluice`` into a fresh venv, at the lowest protobuf and grpcio the generated code
accepts (issue 18, "Packaging"): it pulls neither kubernetes, redis nor prometheus-client (nor the
other server-only packages); its SDK works against a real ``sluice up`` (started from the full
install), and so do the SDK's unit tests; its ``sluice up`` and service sub-commands say to install
``sluice[server]`` instead of failing with a traceback.

The newest versions the ranges allow are what ``make test`` installs for everything else.
The venv is made once per session (about a minute with pip's cache, longer on a cold one).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import ROOT
from tests.integration.cli.test_cli_system import Up, start_up

SERVER_ONLY = {
    "kubernetes",
    "redis",
    "prometheus-client",
    "uvloop",
    "hiredis",
    "grpcio-health-checking",
    "pyjwt",
}


def floors() -> dict[str, str]:
    """The lower bounds of grpcio and protobuf in pyproject.toml: what the slim venv pins."""
    text = (ROOT / "pyproject.toml").read_text()
    deps = text[text.index("dependencies = [") : text.index("[project.optional-dependencies]")]
    out = {}
    for name in ("grpcio", "protobuf"):
        m = re.search(rf'"{name}>=([0-9.]+),<', deps)
        assert m, f"no floor for {name} in pyproject.toml's dependencies"
        out[name] = m.group(1)
    return out


def generated_floors() -> dict[str, str]:
    """What the committed generated code checks at import (services/sluice/v1)."""
    pb2 = (ROOT / "services/sluice/v1/broker_pb2.py").read_text()
    m = re.search(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", pb2)
    assert m
    grpc_py = (ROOT / "services/sluice/v1/broker_pb2_grpc.py").read_text()
    g = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", grpc_py)
    assert g
    return {"protobuf": ".".join(m.groups()), "grpcio": g.group(1)}


@pytest.fixture(scope="module")
def slim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with `pip install sluice` (from a copy of the sources) at the floors."""
    base = tmp_path_factory.mktemp("slim")
    src = base / "src"
    src.mkdir()
    # A copy, so the build writes its build/ and egg-info there, never into the checkout.
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "services", src / "services", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    pins = [f"{name}=={version}" for name, version in floors().items()]
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src), *pins],
        check=True,
        timeout=600,
    )
    return py


#: The SDK's own unit tests (client, codec, consumer, push, errors, wire frames): none imports a
#: service, so they run on the slim install, at the floors.
SDK_UNIT_TESTS = [
    "tests/unit/client",
    "tests/unit/codec",
    "tests/unit/consumer",
    "tests/unit/push",
    "tests/unit/test_errors.py",
    "tests/unit/test_wire_frames.py",
]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    stack = start_up(tmp_path_factory.mktemp("slim-up") / "data")
    try:
        yield stack
    finally:
        stack.stop()


def installed(py: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return {d["name"].lower(): d["version"] for d in json.loads(out)}


def test_the_floors_are_what_the_generated_code_checks() -> None:
    assert floors() == generated_floors()


def test_a_slim_install_pulls_no_server_dependency_and_is_at_the_floors(slim: Path) -> None:
    packages = installed(slim)
    assert not SERVER_ONLY & set(packages), sorted(SERVER_ONLY & set(packages))
    assert packages["sluice"]
    for name, version in floors().items():
        assert packages[name] == version, (name, packages[name])


def test_the_sdk_of_a_slim_install_works_against_sluice_up(slim: Path, up: Up) -> None:
    checks = Path(__file__).with_name("sdk_checks.py")
    result = subprocess.run(
        [str(slim), str(checks), up.bootstrap], capture_output=True, text=True, timeout=400, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok no-server-imports" in result.stdout
    # The CLI's client commands too.
    sluice = slim.parent / "sluice"
    listed = subprocess.run(
        [str(sluice), "--bootstrap", up.bootstrap, "topic", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert "slim-" in listed.stdout


def test_the_sdk_unit_tests_pass_on_the_slim_install_at_the_floors(slim: Path) -> None:
    # The test tools only (pytest's and hypothesis' dependencies are no server package); the suite's
    # conftest puts services/ first on sys.path, so the code is this checkout's and the libraries
    # (grpcio, protobuf at the floors) are the slim venv's.
    tools = ["pytest", "pytest-timeout", "hypothesis"]
    subprocess.run(
        [str(slim), "-m", "pip", "install", "-q", "--disable-pip-version-check", *tools],
        check=True,
        timeout=600,
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    result = subprocess.run(
        [str(slim), "-m", "pytest", "-q", "-p", "no:cacheprovider", *SDK_UNIT_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    assert not SERVER_ONLY & set(installed(slim))


@pytest.mark.parametrize(
    "command", [["up"], ["broker"], ["coordinator", "--help"], ["broker", "verify", "x"]]
)
def test_service_commands_of_a_slim_install_say_to_install_the_server_extra(
    slim: Path, command: list[str], tmp_path: Path
) -> None:
    result = subprocess.run(
        [str(slim.parent / "sluice"), *command],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "SERVER_NOT_INSTALLED" in result.stderr
    assert "pip install 'sluice[server]'" in result.stderr
    assert "Traceback" not in result.stderr
