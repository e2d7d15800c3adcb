"""deploy/spark/README.md's local command runs exactly as written (issue 18: it failed without
PYSPARK_PYTHON): the first command of its first sh block, with only the addresses and paths swapped for
this test's, in an environment without PYSPARK_PYTHON and without the venv on PATH (so Spark's default
worker, `python3` from PATH, would be the system's)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

from sluice.client.client import Client
from tests.harness import ROOT

from .conftest import SPARK_JAVA_OPTS, Stack

README = ROOT / "deploy" / "spark" / "README.md"


def first_command() -> list[str]:
    block = re.search(r"```sh\n(.*?)```", README.read_text(), flags=re.S)
    assert block
    return shlex.split(block.group(1).splitlines()[0])


def test_the_readme_export_command_runs_as_written(stack: Stack, client: Client, tmp_path: Path) -> None:
    argv = first_command()
    assert argv[:2] == [".venv/bin/python", "spark-jobs/export.py"]
    topic = f"readme-{uuid.uuid4().hex[:8]}"
    client.admin.create_topic(topic, partitions=2)
    with client.producer(topic) as producer:
        for i in range(20):
            producer.send(f"v{i}".encode())
        producer.flush()
    swap = {"127.0.0.1:7600": stack.bootstrap, "orders": topic, "/tmp/orders_export": str(tmp_path / "out")}
    argv = [sys.executable, *(swap.get(a, a) for a in argv[1:])]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "PYTHONPATH", "VIRTUAL_ENV"))}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    # Speed only (the command and its environment are otherwise as the README says): this JVM lives
    # ~20 s for a 20-record export, so the client compiler and the serial GC win over C2 and G1 on 2 cores.
    env["JDK_JAVA_OPTIONS"] = SPARK_JAVA_OPTS
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert any(p.name.startswith("date=") for p in (tmp_path / "out").iterdir())
