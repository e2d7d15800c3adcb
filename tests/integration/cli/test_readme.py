"""The README's quickstart runs as written against a real ``sluice up`` (so it cannot rot): the shell
block line by line through bash, with the venv's ``sluice`` on PATH as its first line asks, and the Python
block as a script. Only the bootstrap address differs (``SLUICE_BOOTSTRAP``; the Python block's literal
default address is replaced by the stack's)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import ROOT, _env
from tests.integration.cli.test_cli_system import Up, start_up

README = ROOT / "README.md"


def quickstart_blocks() -> tuple[str, str]:
    """The quickstart's ``sh`` block and the ``python`` block after it."""
    text = README.read_text()
    section = text[text.index("## Five-minute quickstart") :]
    shell = re.search(r"```sh\n(.*?)```", section, re.S)
    python = re.search(r"```python\n(.*?)```", section, re.S)
    assert shell is not None
    assert python is not None
    return shell.group(1), python.group(1)


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


def test_the_python_quickstart_runs_as_written(up: Up, tmp_path: Path) -> None:
    _, python = quickstart_blocks()
    assert '"127.0.0.1:7600"' in python
    script = tmp_path / "quickstart.py"
    script.write_text(python.replace('"127.0.0.1:7600"', repr(up.bootstrap)))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=_env(), check=False
    )
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()[:2]
    assert first.split()[1] == "0"  # partition, offset 0 of a new topic
    assert second.split()[0] == "0"
    assert "b'v'" in second
