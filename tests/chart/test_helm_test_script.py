"""The `helm test` script, run for real: against the local `sluice up` stack instead of a cluster.

The script is the one the chart renders (taken from the rendered ConfigMap), given the same env the
test pod gets, with the real `sluice` CLI on PATH and the bootstrap address `sluice up` prints.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.chart.chartlib import one, render

BOOTSTRAP = re.compile(r"Bootstrap: (\S+)")


def rendered_script() -> tuple[str, dict[str, str]]:
    manifests = render()
    script: str = one(manifests, "ConfigMap", "sluice-test-produce-consume")["data"]["produce-consume.sh"]
    pod = one(manifests, "Pod", "sluice-test-produce-consume")
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    return script, env


@contextmanager
def sluice_up_stack(tmp_path: Path, *extra: str) -> Iterator[str]:
    """`sluice up` on ephemeral ports in a private directory (``extra``: more flags, e.g. an external
    ``--redis-url``); yields the bootstrap address."""
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not on PATH: install it (make deps does) to run the tests")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice", "up", "--data-dir", str(tmp_path / "data"), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    stdout = proc.stdout
    assert stdout is not None
    seen: list[str] = []
    drain = threading.Thread(target=lambda: seen.extend(stdout), daemon=True)
    try:
        for line in stdout:  # `sluice up` prints the bootstrap line once every service is ready
            seen.append(line)
            if m := BOOTSTRAP.search(line):
                # Keep reading its output, so a chatty stack never blocks on a full pipe.
                drain.start()
                yield m.group(1)
                break
        else:
            raise RuntimeError("sluice up exited before it was ready:\n" + "".join(seen))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if drain.is_alive():
            drain.join(10)
        stdout.close()


@pytest.fixture
def sluice_up(tmp_path: Path) -> Iterator[str]:
    """`sluice up` on ephemeral ports in a private directory; yields the bootstrap address."""
    with sluice_up_stack(tmp_path) as bootstrap:
        yield bootstrap


def run_helm_test_script(bootstrap: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The rendered script, with the pod's env, against ``bootstrap``; 50 messages."""
    script, pod_env = rendered_script()
    path = tmp_path / "produce-consume.sh"
    path.write_text(script)
    env = dict(os.environ)
    env.update(pod_env)
    env.update(
        SLUICE_BOOTSTRAP=bootstrap,
        SLUICE_TEST_MESSAGES="50",
        SLUICE_TEST_TIMEOUT="30",
        PATH=str(Path(sys.executable).parent) + os.pathsep + env["PATH"],
        TMPDIR=str(tmp_path),
    )
    return subprocess.run(
        ["sh", str(path)], env=env, capture_output=True, text=True, timeout=150, check=False
    )


def test_helm_test_script_produces_and_consumes_against_a_real_stack(sluice_up: str, tmp_path: Path) -> None:
    proc = run_helm_test_script(sluice_up, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "consumer group read 50" in proc.stdout
    assert "shared subscription received 50" in proc.stdout
    assert proc.stdout.rstrip().endswith("PASS")
