"""The README's quickstart runs as written against a real ``sluice up`` (so it cannot rot): the shell
block line by line through bash, with the venv's ``sluice`` on PATH as its first line asks, and every
``python`` block of the README as a script, in order (a later one may use what an earlier one made); and
the "Secure local cluster" block against ``sluice up --tls --auth``, from the directory holding its
``sluice-data``, as the README runs it. Only the bootstrap address differs (``SLUICE_BOOTSTRAP``; the
Python blocks' literal default address is replaced by the stack's)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice import Client
from tests.harness import ROOT, _env
from tests.integration.cli.test_cli_system import Up, start_up

README = ROOT / "README.md"


def quickstart_blocks() -> tuple[str, str]:
    """The quickstart's ``sh`` block and the first ``python`` block after it."""
    text = README.read_text()
    section = text[text.index("## Five-minute quickstart") :]
    shell = re.search(r"```sh\n(.*?)```", section, re.S)
    python = re.search(r"```python\n(.*?)```", section, re.S)
    assert shell is not None
    assert python is not None
    return shell.group(1), python.group(1)


def python_blocks() -> list[str]:
    """Every ``python`` block of the README, in order."""
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def commands(block: str) -> list[str]:
    """The block's commands, comments and the continuation-comment lines dropped."""
    out = []
    for line in block.splitlines():
        command = line.split(" # ")[0].strip()
        if command and not command.startswith("#"):
            out.append(command)
    return out


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    stack = start_up(tmp_path_factory.mktemp("readme") / "data")
    try:
        yield stack
    finally:
        stack.stop()


def bash(line: str, env: dict[str, str], cwd: Path, timeout: float) -> tuple[int | None, str, str]:
    """Run one line as a user would paste it (in bash, in the repository); None: still running at
    ``timeout`` (a command that follows the topic), stopped then."""
    proc = subprocess.Popen(
        ["bash", "-c", line], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return None, out, err


def test_the_shell_quickstart_runs_as_written(up: Up, tmp_path: Path) -> None:
    shell, _ = quickstart_blocks()
    lines = commands(shell)
    assert lines[0] == "source .venv/bin/activate"
    # The venv the README's set-up makes: here, the interpreter running the tests.
    venv_bin = Path(sys.executable).parent
    assert (venv_bin / "sluice").exists(), "the set-up must install the sluice command into the venv"
    env = _env() | {"SLUICE_BOOTSTRAP": up.bootstrap, "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}"}
    outputs = []
    for line in lines[1:]:
        follows = "--max" not in line and line.startswith("sluice consume")
        code, out, err = bash(line, env, ROOT, timeout=10 if follows else 60)
        assert "Traceback" not in err, (line, err)
        assert code == (None if follows else 0), (line, code, err)
        outputs.append(out)
    # create, produce, produce, consume --max 4, describe, consume --filter (following)
    assert sorted(outputs[3].split()) == ["first", "other", "second", "third"]  # one value per line
    assert "orders" in outputs[4]
    followed = [json.loads(line) for line in outputs[5].splitlines()]
    assert [r["value"] for r in followed] == ["first", "second", "third"]  # tagA only


def run_python(block: str, bootstrap: str, path: Path) -> list[str]:
    """Run one README block as a script against ``bootstrap``; its stdout lines."""
    assert '"127.0.0.1:7600"' in block
    path.write_text(block.replace('"127.0.0.1:7600"', repr(bootstrap)))
    result = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, env=_env(), check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_every_python_snippet_runs_as_written(up: Up, tmp_path: Path) -> None:
    blocks = python_blocks()
    assert len(blocks) == 2, "a new README python block: give it its checks here"
    sync_block, async_block = blocks
    assert sync_block == quickstart_blocks()[1]

    lines = run_python(sync_block, up.bootstrap, tmp_path / "quickstart.py")
    sent, billing, audit = (
        [line.split(maxsplit=3) for line in lines if line.startswith(word)]
        for word in ("sent", "billing", "audit")
    )
    assert len(sent) == 1
    assert sent[0][2] == "0"  # the refund: offset 0 of its partition in a new topic
    values = ["b'payment-0'", "b'payment-1'", "b'payment-2'", "b'refund'"]
    assert sorted(v for *_, v in billing) == values  # the group read all four records
    assert sorted(v for *_, v in audit) == values  # and so did the push subscription, acking each

    lines = run_python(async_block, up.bootstrap, tmp_path / "quickstart_async.py")
    billed = [line.split(maxsplit=3)[3] for line in lines if line.startswith("billing")]
    audited = [line.split(maxsplit=3)[3] for line in lines if line.startswith("audit")]
    assert sorted(billed) == sorted([*values, "b'payment-async'"])  # a new group reads the topic
    assert sorted(audited) == sorted([*values, "b'payment-async'"])
    with Client(up.bootstrap, request_timeout=10) as client:
        assert sum(client.admin.group_offsets("billing").values()) == 4  # committed
        assert sum(client.admin.group_offsets("billing-async").values()) == 5


def secure_block() -> str:
    text = README.read_text()
    section = text[text.index("### Secure local cluster") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    return block.group(1)


@pytest.fixture(scope="module")
def secure_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    # The README's paths are relative to where `sluice up` ran: its data directory is ./sluice-data.
    stack = start_up(tmp_path_factory.mktemp("readme-secure") / "sluice-data", "--tls", "--auth")
    try:
        yield stack
    finally:
        stack.stop()


def test_the_secure_local_cluster_block_runs_as_written(secure_up: Up) -> None:
    lines = commands(secure_block())
    assert lines[0].startswith("export SLUICE_USERNAME=admin ")
    export, rest = lines[0], lines[1:]
    venv_bin = Path(sys.executable).parent
    env = _env() | {
        "SLUICE_BOOTSTRAP": secure_up.bootstrap,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
    }
    cwd = secure_up.data_dir.parent
    results = []
    for line in rest:
        # One shell per line, as pasted into one terminal: the export's variables hold for every line.
        code, out, err = bash(f"{export}\n{line}", env, cwd, timeout=60)
        assert "Traceback" not in err, (line, err)
        results.append((line, code, out, err))
    *works, (denied, code, _, err) = results
    for line, code_, _, err_ in works:
        assert code_ == 0, (line, err_)
    consumed = [out for line, _, out, _ in works if line.startswith(("sluice consume", "sluice --username"))]
    assert consumed == ["hello\n", "hello\n"]  # the admin, then the read-only user
    assert denied.startswith("echo no |")
    assert "produce orders" in denied
    assert code != 0
    assert "PERMISSION_DENIED" in err
